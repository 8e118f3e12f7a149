"""End-to-end fixtures: one real `warren up` per test session, on free loopback ports, with a temporary
state directory, the real runtime, the static agent and the base rootfs.

When something it needs is missing (not root, binaries not built, no rootfs, no SDK) every test is
skipped and one `SKIP: <reason>` line is printed at the end of the run.
"""

import os
import sys
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ROOTFS = Path(os.environ.get("WARREN_CACHE", "/var/cache/warren")) / "rootfs" / "debian12-base"
# Bounds for waits (not assertions on speed): generous so a loaded 2-core CI machine still passes.
SERVER_START_WAIT_S = 120
COMMAND_WAIT_S = 300


# Addresses of the tests' own "internet" (a network namespace on a test-owned /29 of 198.18.0.0/15,
# see test_egress_e2e.py): the host side, server A (also the DNS server) and server B.
_third = 100 + os.getpid() % 100
TEST_INTERNET = {
    "local": f"198.18.{_third}.1",
    "a": f"198.18.{_third}.2",
    "b": f"198.18.{_third}.3",
    "dns": f"198.18.{_third}.2",
    "c": f"198.18.{_third}.4",
}


def make_test_pki(directory: str) -> dict:
    """A CA of the tests' own and a certificate for api.allowed.test signed by it (openssl CLI), for
    the HTTPS server of the tests' internet; the server's egress proxy is told to trust the CA."""
    d = Path(directory)

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "2",
        "-subj", "/CN=warren e2e upstream CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign")
    run("req", *ec, "-keyout", str(d / "leaf.key"), "-out", str(d / "leaf.csr"),
        "-subj", "/CN=api.allowed.test")
    (d / "leaf.ext").write_text("subjectAltName=DNS:api.allowed.test\n")
    run("x509", "-req", "-in", str(d / "leaf.csr"), "-CA", str(d / "ca.pem"), "-CAkey",
        str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "leaf.pem"), "-days", "2",
        "-extfile", str(d / "leaf.ext"))
    return {"ca": str(d / "ca.pem"), "cert": str(d / "leaf.pem"), "key": str(d / "leaf.key")}


def _target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


def warren_binary() -> Path | None:
    if os.environ.get("WARREN_BIN"):
        return Path(os.environ["WARREN_BIN"])
    for profile in ("debug", "release"):
        candidate = _target_dir() / profile / "warren"
        if candidate.is_file():
            return candidate
    return None


def agent_binary() -> Path | None:
    if os.environ.get("WARREN_AGENT"):
        return Path(os.environ["WARREN_AGENT"])
    candidate = REPO / "target" / "agent" / "x86_64-unknown-linux-gnu" / "agent" / "warren-agent"
    return candidate if candidate.is_file() else None


def base_rootfs() -> Path:
    return Path(os.environ.get("WARREN_BASE_ROOTFS", DEFAULT_ROOTFS))


def missing_prerequisite() -> str | None:
    """Why the end-to-end tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "e2e tests need root (namespaces, cgroups, the warren0 bridge)"
    if warren_binary() is None:
        return f"no warren binary under {_target_dir()} (run `cargo build -p warren-cli`)"
    if agent_binary() is None:
        return "no static agent (run scripts/build-agent)"
    rootfs = base_rootfs()
    if not (rootfs / "bin" / "bash").exists():
        return f"no base rootfs at {rootfs} (run scripts/setup)"
    try:
        import e2b  # noqa: F401
    except ImportError:
        return "the e2b SDK is not installed (tests/sdk/requirements.txt)"
    return None


_skip_reasons = []


def pytest_terminal_summary(terminalreporter):
    reason = missing_prerequisite() or (_skip_reasons[0] if _skip_reasons else None)
    if reason:
        terminalreporter.write_line(f"SKIP: {reason}")


def poll(what: str, check, bound_s: float, pause: float = 0.5):
    """Calls `check` until it returns something true, and returns that; fails naming `what` after
    `bound_s` seconds (a bound on a wait, never a speed assertion)."""
    deadline = time.monotonic() + bound_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {bound_s}s"
        time.sleep(pause)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, deadline: float, process=None) -> None:
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"warren up exited with {process.returncode} before 127.0.0.1:{port} listened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class Warren:
    """A running `warren up` and the environment a client needs to use it."""

    def __init__(self, process, env, state_dir, log_path):
        self.process = process
        self.env = env
        self.state_dir = state_dir
        self.log_path = log_path

    @property
    def binary(self) -> str:
        return str(warren_binary())

    @property
    def api_url(self) -> str:
        return self.env["E2B_API_URL"]

    def cli(self, *args, env=None, input=None, timeout=COMMAND_WAIT_S) -> subprocess.CompletedProcess:
        """Runs the `warren` CLI against this server."""
        full_env = {**os.environ, **self.env, **(env or {})}
        return subprocess.run(
            [str(warren_binary()), *args],
            env=full_env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")


def _parse_exports(lines) -> dict:
    exports = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            exports[key] = value.strip().strip("'\"")
    return exports


@pytest.fixture(scope="session")
def warren(request):
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    api_port, proxy_port = free_port(), free_port()
    state_dir = tempfile.mkdtemp(prefix="wt-e2e-state-")
    pki_dir = tempfile.mkdtemp(prefix="wt-e2e-pki-")
    TEST_INTERNET["pki"] = make_test_pki(pki_dir)
    log_file = tempfile.NamedTemporaryFile(prefix="wt-e2e-warren-", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") and k != "WARREN_API_KEY"}
    process = subprocess.Popen(
        [
            str(warren_binary()),
            "up",
            "--listen",
            f"127.0.0.1:{api_port}",
            "--proxy-listen",
            f"127.0.0.1:{proxy_port}",
            "--state-dir",
            state_dir,
            "--agent",
            str(agent_binary()),
            "--base-rootfs",
            str(base_rootfs()),
            # The egress proxy resolves allowed host names with the DNS server of the tests' own
            # "internet" (test_egress_e2e.py), which is made after the server starts: the server
            # treats the networks the host is on at its start as always denied.
            "--egress-resolver",
            str(TEST_INTERNET["dns"]),
            "--egress-upstream-ca",
            TEST_INTERNET["pki"]["ca"],
            # A sample a second, so the metrics tests (test_fleet_e2e.py) see a series in seconds.
            "--metrics-interval-secs",
            "1",
            # Webhook retries a second apart instead of ten (test_webhooks_e2e.py).
            "--webhook-retry-secs",
            "1",
            # A warm pool of the template test_warm_pool_e2e.py builds (empty until then).
            "--warm-pool",
            "wt-e2e-pooled=2",
            # Admission holds a build step's whole layer against the state disk; CI machines' disks
            # are smaller than an operator's, and no step here writes more than a few hundred MiB.
            "--build-disk-mib",
            "4096",
        ],
        stdout=subprocess.PIPE,
        stderr=log_file,
        text=True,
        env=env,
    )
    stdout_lines = []
    exports_seen = threading.Event()

    def read_stdout():
        for line in process.stdout:
            stdout_lines.append(line)
            if "E2B_API_KEY" in _parse_exports(stdout_lines):
                exports_seen.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    deadline = time.monotonic() + SERVER_START_WAIT_S
    try:
        if not exports_seen.wait(SERVER_START_WAIT_S):
            _skip_if_build_has_no_runtime(process, log_file.name)
            raise RuntimeError(
                f"warren up printed no export lines; stdout={stdout_lines!r}\n"
                f"log:\n{Path(log_file.name).read_text(errors='replace')}"
            )
        try:
            wait_for_port(api_port, deadline, process)
            wait_for_port(proxy_port, deadline, process)
        except RuntimeError:
            _skip_if_build_has_no_runtime(process, log_file.name)
            raise
        exports = _parse_exports(stdout_lines)
        assert exports["E2B_API_URL"] == f"http://127.0.0.1:{api_port}", exports
        assert exports["E2B_SANDBOX_URL"] == f"http://127.0.0.1:{proxy_port}", exports
        server = Warren(process, exports, state_dir, log_file.name)
        _wait_for_builtin_template_build(server, deadline=time.monotonic() + BUILTIN_BUILD_WAIT_S)
        yield server
    finally:
        _kill_leftover_sandboxes(stdout_lines)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # Warren's lxcfs daemon outlives `warren up` on purpose; detaching its mount ends it.
        subprocess.run(["umount", "-l", os.path.join(state_dir, "lxcfs")], check=False,
                       stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", state_dir], check=False)
        subprocess.run(["rm", "-rf", pki_dir], check=False)
        log_file.close()
        if request.session.testsfailed:
            # What the server saw is the first thing a failure needs; keep it past the run.
            sys.__stderr__.write(f"\nwarren server log kept at {log_file.name}\n")
        else:
            os.unlink(log_file.name)


# `warren up` builds its code-interpreter template at start when that rootfs exists
# (scripts/setup.d/45-code-interpreter-rootfs.sh). The fixture waits for that build, so its build sandbox
# (8 GiB of disk in admission while it lives) is gone before tests create sandboxes on a tight disk.
CODE_INTERPRETER_ROOTFS = Path(
    os.environ.get("WARREN_CODE_INTERPRETER_ROOTFS", "/var/cache/warren/rootfs/debian12-code-interpreter")
)
BUILTIN_BUILD_WAIT_S = 600


def _wait_for_builtin_template_build(server, deadline: float) -> None:
    """Waits until the code-interpreter template is ready or failed (its tests report which)."""
    import json
    import urllib.error
    import urllib.request

    if not (CODE_INTERPRETER_ROOTFS / ".warren-complete").is_file():
        return
    request = urllib.request.Request(
        f"{server.api_url}/templates/code-interpreter-v1", headers={"X-API-Key": server.env["E2B_API_KEY"]}
    )
    # The server registers the template right after it starts; one that never appears was not offered
    # (the server log says why), and there is no build to wait for.
    registered_by = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = json.loads(response.read())["builds"][0]["status"]
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
            if time.monotonic() > registered_by:
                return
            status = "missing"
        if status not in ("missing", "waiting", "building"):
            return
        time.sleep(0.2)


# What `warren up` says when the server crate was built without a runtime for this host.
NO_RUNTIME_MESSAGE = "has no Linux runtime"


def _skip_if_build_has_no_runtime(process, log_path):
    """A build whose server has no runtime wired is a missing prerequisite, not a failure."""
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return
    log = Path(log_path).read_text(errors="replace")
    if NO_RUNTIME_MESSAGE in log:
        reason = "this build's server has no Linux runtime (warren up: 'has no Linux runtime')"
        _skip_reasons.append(reason)
        pytest.skip(reason)


def _kill_leftover_sandboxes(stdout_lines):
    """Kills whatever sandboxes a failed test left, through the API, so nothing outlives the run."""
    exports = _parse_exports(stdout_lines)
    if "E2B_API_KEY" not in exports:
        return
    env = {**os.environ, **exports}
    listed = subprocess.run(
        [str(warren_binary()), "sandbox", "list", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    if listed.returncode != 0:
        return
    import json

    ids = [s["sandboxID"] for s in json.loads(listed.stdout or "[]")]
    if ids:
        subprocess.run([str(warren_binary()), "sandbox", "kill", *ids], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def sdk_env(warren, monkeypatch_session):
    for key, value in warren.env.items():
        monkeypatch_session.setenv(key, value)
    return warren.env


@pytest.fixture(scope="session")
def monkeypatch_session():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
