"""Crash harness: a real `warren up` on a state dir that outlives it, killed with SIGKILL in the middle
of an operation and started again; then everything it promises after a crash is checked.

Used by tests/crash/test_*.py (short, seeded, part of ./test) and by scripts/crash-matrix (long,
seeded, hundreds of kills). Must run inside a private network namespace (/tmp/privnet.sh): it reads
the namespace's links and nftables sets and assumes every `wv-*` veth and every element is its own.

What is checked after every restart (see docs/reliability.md):
- every sandbox row is running, paused, killed or failed (lost) with a reason; none is left mid-way;
- every running sandbox answers commands; every paused one resumes and its counter process kept
  its memory (it counts on from at least the value it had before the crash);
- no checkpoint is half-written (no temporary checkpoint directory; every stored one has its
  manifest);
- nothing is left over: the runtime's sandboxes, `wv-*` veths, `ports`/`internet` elements, cgroups,
  mounts, loop devices and supervisor processes belong exactly to the live sandboxes, no CRIU runs;
- no sandbox runs twice (one supervisor per live sandbox).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ROOTFS = Path(os.environ.get("WARREN_CACHE", "/var/cache/warren")) / "rootfs" / "debian12-base"
# Bounds for waits, never assertions on speed.
START_WAIT_S = 120
OP_WAIT_S = 180
COUNTER_FILE = "/tmp/wt-counter"
COUNTER = (
    "i=0; while :; do i=$((i+1)); echo $i > /tmp/wt-counter.tmp && mv /tmp/wt-counter.tmp "
    f"{COUNTER_FILE}; sleep 0.05; done"
)
SETTLED = {"running", "paused", "killed", "failed"}
CGROUP_ROOTS = [Path("/sys/fs/cgroup") / c / "warren" for c in ("memory", "pids", "cpu", "freezer")] + [
    Path("/sys/fs/cgroup/warren")
]


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


def warren_binary() -> Path | None:
    if os.environ.get("WARREN_BIN"):
        return Path(os.environ["WARREN_BIN"])
    for profile in ("debug", "release"):
        candidate = target_dir() / profile / "warren"
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
    """Why crash tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "crash tests need root (namespaces, cgroups, a bridge)"
    if warren_binary() is None:
        return f"no warren binary under {target_dir()} (cargo build --bins -p warren-cli -p warren-runtime)"
    if agent_binary() is None:
        return "no static agent (run scripts/build-agent)"
    if not (base_rootfs() / "bin" / "bash").exists():
        return f"no base rootfs at {base_rootfs()} (run scripts/setup)"
    if not Path("/usr/local/sbin/criu").exists() and not os.environ.get("WARREN_CRIU"):
        return "no CRIU (scripts/setup.d/30-criu.sh): pause, fork and snapshot cannot checkpoint"
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    if any(n != "lo" and n != "warren0" and not n.startswith("wv-") for n in names):
        return "run inside a private network namespace (scripts/crash-matrix, /tmp/privnet.sh): the checks own every veth"
    try:
        import e2b  # noqa: F401
    except ImportError:
        return "the e2b SDK is not installed (tests/sdk/requirements.txt)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, probe, limit: float = OP_WAIT_S, pause: float = 0.05):
    """Polls `probe` until it returns something other than None/False; raises with the last error."""
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as error:  # noqa: BLE001 - reported if it never works
            last = error
        time.sleep(pause)
    raise AssertionError(f"{what} within {limit}s; last error: {last!r}")


# --- logs ----------------------------------------------------------------------------------------

# Set by the conftest hooks once a test failed: from then on the servers' and nodes' logs stay in
# /tmp for a look; a run that passes leaves none behind.
KEEP_LOGS = False


def drop_log(path) -> None:
    """Removes a server's or node's log, unless a test of this run failed."""
    if not KEEP_LOGS:
        Path(path).unlink(missing_ok=True)


def keep_logs_after_failures(report) -> None:
    """For a conftest's `pytest_runtest_makereport` hook."""
    global KEEP_LOGS
    if report.failed:
        KEEP_LOGS = True


def stop_process(process: subprocess.Popen | None, how: int) -> None:
    """Asks `process` to stop with signal `how`; SIGKILL if it has not within a minute."""
    if process is None:
        return
    process.send_signal(how)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- a private PostgreSQL ------------------------------------------------------------------------

NOBODY = 65534


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's `postgresql` package)."""
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (int(p.name), p / "bin") for p in root.iterdir() if p.name.isdigit() and (p / "bin" / "initdb").is_file()
    ) if root.is_dir() else []
    return versions[-1][1] if versions else None


def _as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


class Postgres:
    """A private cluster (`initdb` in a temp dir as `nobody`, a unix socket in that dir, no TCP
    listener, fsync off) with a `warren` database: `url` for the server, `sql()` for the test's own
    looks at the rows, `stop()` and `start()` to restart it under a running server."""

    def __init__(self, password: str):
        bin_dir = pg_bin()
        assert bin_dir is not None
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="wt-pg-e2e-"))
        self.socket_dir = self.root / "sock"
        self.socket_dir.mkdir()
        for path in (self.root, self.socket_dir):
            os.chown(path, NOBODY, NOBODY)
        self.url = f"postgres://postgres:{password}@localhost/warren?host={self.socket_dir}"
        self.process: subprocess.Popen | None = None
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(self.root / "data"), "-U", "postgres", "--auth=trust",
             "--no-sync", "--no-locale", "-E", "UTF8"],
            check=True, capture_output=True, preexec_fn=_as_nobody,
        )
        self.start()
        subprocess.run([str(bin_dir / "createdb"), "-h", str(self.socket_dir), "-U", "postgres", "warren"],
                       check=True)

    def start(self) -> None:
        log = open(self.root / "postgres.log", "a")
        os.chown(self.root / "postgres.log", NOBODY, NOBODY)
        self.process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.root / "data"), "-k", str(self.socket_dir),
             "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off"],
            stdout=log, stderr=log, preexec_fn=_as_nobody,
        )
        log.close()
        wait_until("PostgreSQL accepting connections", lambda: subprocess.run(
            [str(self.bin_dir / "pg_isready"), "-q", "-h", str(self.socket_dir), "-U", "postgres"]).returncode == 0,
            60, 0.1)

    def stop(self) -> None:
        """Fast shutdown: every connection is cut, as when the database is restarted."""
        stop_process(self.process, signal.SIGINT)
        self.process = None

    def sql(self, query: str) -> str:
        """Runs `query` on the `warren` database; its unaligned, tuple-only output."""
        run = subprocess.run(
            [str(self.bin_dir / "psql"), "-h", str(self.socket_dir), "-U", "postgres", "-d", "warren", "-At",
             "-c", query],
            capture_output=True, text=True, timeout=60,
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    def rows(self, query: str) -> list[dict]:
        """The rows of `query` as dicts (through `json_agg`)."""
        text = self.sql(f"SELECT coalesce(json_agg(t), '[]') FROM ({query}) t")
        return json.loads(text)


@contextlib.contextmanager
def private_postgres(password: str = "unused"):
    """A started `Postgres`, stopped and removed on the way out. The caller has checked `pg_bin()`;
    trust authentication ignores the password."""
    database = Postgres(password)
    try:
        yield database
    finally:
        database.stop()
        subprocess.run(["rm", "-rf", str(database.root)], check=False)


class Warren:
    """`warren up` over one state dir, started and killed again and again."""

    def __init__(self, state_dir: Path | None = None):
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="wt-crash-state-"))
        self.api_port, self.proxy_port = free_port(), free_port()
        self.api_key: str | None = None
        self.process: subprocess.Popen | None = None
        self.log_path = self.state_dir.with_name(self.state_dir.name + ".log")
        self.starts = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def sandbox_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def _command(self) -> list[str]:
        return [
            str(warren_binary()),
            "up",
            "--listen",
            f"127.0.0.1:{self.api_port}",
            "--proxy-listen",
            f"127.0.0.1:{self.proxy_port}",
            "--state-dir",
            str(self.state_dir),
            "--agent",
            str(agent_binary()),
            "--base-rootfs",
            str(base_rootfs()),
            # The crash checks count the sandboxes and links Warren holds: no built-in template
            # build running beside them at start.
            "--no-code-interpreter",
        ]

    def start_and_sigkill(self, delay: float) -> None:
        """Starts `warren up` and SIGKILLs it `delay` seconds later, whatever it was doing (its start-up
        reconciliation, for a short delay)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        with open(self.log_path, "a") as log:
            log.write(f"\n==== start {self.starts + 1} (killed after {delay:.3f} s)\n")
            log.flush()
            process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL, stderr=log, env=env)
        self.starts += 1
        time.sleep(delay)
        process.kill()
        process.wait()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        log = open(self.log_path, "a")
        log.write(f"\n==== start {self.starts + 1}\n")
        log.flush()
        self.process = subprocess.Popen(
            self._command(),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
        log.close()
        self.starts += 1
        exports: dict[str, str] = {}
        done = threading.Event()

        def read_stdout():
            for line in self.process.stdout:
                line = line.strip()
                if line.startswith("export ") and "=" in line:
                    key, _, value = line[len("export ") :].partition("=")
                    exports[key] = value.strip("'\"")
                if "E2B_API_URL" in exports and "E2B_SANDBOX_URL" in exports:
                    done.set()

        threading.Thread(target=read_stdout, daemon=True).start()
        deadline = time.monotonic() + START_WAIT_S
        while not done.is_set() and time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"warren up exited with {self.process.returncode}:\n{self.log_tail()}")
            done.wait(0.1)
        if not done.is_set():
            raise RuntimeError(f"warren up printed no exports in {START_WAIT_S}s:\n{self.log_tail()}")
        time.sleep(0.05)  # the key line follows the URL lines
        if self.api_key is None:
            self.api_key = exports.get("E2B_API_KEY")
            if not self.api_key:
                raise RuntimeError("the first start printed no API key")
        for port in (self.api_port, self.proxy_port):
            wait_until(f"127.0.0.1:{port} listens", lambda p=port: socket.create_connection(("127.0.0.1", p), 1).close() or True)
        os.environ["E2B_API_URL"] = self.api_url
        os.environ["E2B_SANDBOX_URL"] = self.sandbox_url
        os.environ["E2B_API_KEY"] = self.api_key

    def sigkill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def stop(self) -> None:
        stop_process(self.process, signal.SIGTERM)
        self.process = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def api(self, method: str, path: str, body=None, timeout: float = OP_WAIT_S):
        """One REST call; returns (status, parsed body or text)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"X-API-Key": self.api_key or "", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                raw = answer.read()
                status = answer.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    # What the store says (read-only; the server is the only writer).
    def rows(self) -> list[dict]:
        db = sqlite3.connect(f"file:{self.state_dir / 'warren.db'}?mode=ro", uri=True, timeout=30)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT id, state, state_reason, pause_kind, snapshot_dir FROM sandboxes")]
        finally:
            db.close()

    def snapshot_dirs(self) -> list[str]:
        db = sqlite3.connect(f"file:{self.state_dir / 'warren.db'}?mode=ro", uri=True, timeout=30)
        try:
            return [r[0] for r in db.execute("SELECT dir FROM snapshots")]
        finally:
            db.close()

    def cleanup(self) -> None:
        """Kills every sandbox through the API and stops the server; removes the state dir."""
        if self.process is not None:
            for row in self.rows():
                if row["state"] in ("running", "paused"):
                    self.api("DELETE", f"/sandboxes/{row['id']}")
            self.stop()
        # Warren's lxcfs daemon outlives `warren up` on purpose (a restarted server reuses it);
        # detaching its mount ends it, where removing the directory under it would not.
        subprocess.run(["umount", "-l", str(self.state_dir / "lxcfs")], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.state_dir)], check=False)
        drop_log(self.log_path)


# --- sandboxes with a counter -------------------------------------------------------------------


def sdk():
    from e2b import Sandbox

    return Sandbox


def read_counter(sandbox_id: str) -> int:
    box = sdk().connect(sandbox_id, timeout=600)
    text = box.commands.run(f"cat {COUNTER_FILE}", timeout=60).stdout.strip()
    return int(text)


def start_counter(warren: Warren) -> tuple[str, int]:
    """A fresh sandbox running the counter; returns its id and a value the counter has passed."""
    status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 3600})
    assert status == 201, (status, body)
    sandbox_id = body["sandboxID"]
    box = sdk().connect(sandbox_id, timeout=3600)
    box.commands.run(COUNTER, background=True)
    value = wait_until("the counter counts", lambda: (lambda v: v if v >= 3 else None)(read_counter(sandbox_id)))
    return sandbox_id, value


# --- operations, each cut short by a SIGKILL -----------------------------------------------------

OPERATIONS = ("create", "kill", "pause", "resume", "fork", "snapshot")


@dataclass
class Model:
    """What the harness knows about the sandboxes: the counter value each had passed."""

    counters: dict[str, int] = field(default_factory=dict)


def operation_request(op: str, sandbox_id: str | None):
    if op == "create":
        return "POST", "/sandboxes", {"templateID": "base", "timeout": 3600}
    if op == "kill":
        return "DELETE", f"/sandboxes/{sandbox_id}", None
    if op == "pause":
        return "POST", f"/sandboxes/{sandbox_id}/pause", None
    if op == "resume":
        return "POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 3600}
    if op == "fork":
        return "POST", f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 3600}
    if op == "snapshot":
        return "POST", f"/sandboxes/{sandbox_id}/snapshots", {"name": "wt-crash"}
    raise ValueError(op)


def run_cut_short(warren: Warren, op: str, sandbox_id: str | None, delay: float) -> str:
    """Sends `op` and SIGKILLs the server `delay` seconds later (or right after it answered, when it
    answers first). Returns what happened: 'answered' or 'killed'."""
    method, path, body = operation_request(op, sandbox_id)
    answered = threading.Event()

    def send():
        try:
            warren.api(method, path, body)
        except Exception:  # noqa: BLE001 - the connection dies with the server
            pass
        answered.set()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    outcome = "answered" if answered.wait(delay) else "killed"
    warren.sigkill()
    thread.join(30)
    return outcome


# --- what must hold after a restart ---------------------------------------------------------------


def live_runtime_ids(warren: Warren) -> set[str]:
    root = warren.state_dir / "sandboxes"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def host_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ": wv-" in line]


def nft_elements(family: str, name: str) -> list:
    out = subprocess.run(["nft", "-j", "list", "set", family, "warren", name], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    for item in json.loads(out.stdout).get("nftables", []):
        if "set" in item:
            return item["set"].get("elem", [])
    return []


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmdline and not stat.rsplit(")", 1)[-1].strip().startswith("Z"):
            found.append((int(entry.name), cmdline))
    return found


def check_after_restart(warren: Warren, model: Model, known_ids: set[str]) -> dict:
    """Asserts every promise after a crash; returns a summary (states by sandbox)."""
    rows = warren.rows()
    states = {r["id"]: r["state"] for r in rows}
    for row in rows:
        assert row["state"] in SETTLED, f"{row['id']} left {row['state']} after restart: {row}"
        if row["state"] == "failed":
            assert row["state_reason"], f"{row['id']} failed without a reason"
    live = {r["id"] for r in rows if r["state"] == "running" or (r["state"] == "paused" and r["pause_kind"] == "freeze")}
    runtime = live_runtime_ids(warren)
    assert runtime == live, f"runtime holds {sorted(runtime)}, store says live {sorted(live)}"

    # No half-written checkpoint; every stored one complete.
    snapshots = warren.state_dir / "snapshots"
    if snapshots.is_dir():
        temps = [p.name for p in snapshots.iterdir() if ".tmp-" in p.name]
        assert not temps, f"half-written checkpoints left: {temps}"
    for row in rows:
        if row["state"] == "paused" and row["pause_kind"] == "checkpoint":
            assert row["snapshot_dir"] and (Path(row["snapshot_dir"]) / "manifest.json").is_file(), row
    for directory in warren.snapshot_dirs():
        assert (Path(directory) / "manifest.json").is_file(), f"snapshot {directory} has no manifest"

    # Nothing left over, nothing twice.
    links = host_links()
    assert len(links) == len(live), f"veths {links} for live sandboxes {sorted(live)}"
    ports = nft_elements("bridge", "ports")
    assert len(ports) == len(live), f"nft ports {ports} for live sandboxes {sorted(live)}"
    assert len(nft_elements("ip", "internet")) <= len(live)
    for sandbox_id in known_ids | set(states):
        for root in CGROUP_ROOTS:
            if (root / sandbox_id).exists():
                assert sandbox_id in live, f"cgroup {root / sandbox_id} of a sandbox that is not live"
    mounts = Path("/proc/self/mountinfo").read_text()
    sandboxes_dir = str(warren.state_dir / "sandboxes") + "/"
    for line in mounts.splitlines():
        for word in line.split():
            if word.startswith(sandboxes_dir):
                owner = word[len(sandboxes_dir) :].split("/")[0]
                assert owner in live, f"mount {word} of a sandbox that is not live"
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    for line in loops.splitlines():
        if sandboxes_dir in line:
            owner = line.split(sandboxes_dir, 1)[1].split("/")[0]
            assert owner in live, f"loop device {line} of a sandbox that is not live"
    supervisors = processes_mentioning(sandboxes_dir)
    owners = [
        cmd.split(sandboxes_dir, 1)[1].split()[0].split("/")[0] for _, cmd in supervisors if "warren-supervisor" in cmd
    ]
    assert sorted(owners) == sorted(live), f"supervisors {owners} for live sandboxes {sorted(live)}"
    # A dump the previous server finished may still be exiting (seen once right after a pause that
    # had answered); one that lasts is a leftover.
    def dumps():
        return [p for p in processes_mentioning(" dump --tree ") if "criu" in p[1]]

    try:
        wait_until("no criu dump runs", lambda: not dumps(), limit=10)
    except AssertionError:
        def describe(pid, cmd):
            try:
                wchan = Path(f"/proc/{pid}/wchan").read_text(errors="replace")
                stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")[:120]
            except OSError as error:
                wchan, stat = "", str(error)
            return (pid, stat, f"wchan={wchan}", cmd[:300])

        detail = [describe(pid, cmd) for pid, cmd in dumps()]
        raise AssertionError(f"a criu dump still runs 10 s after the restart: {detail}") from None

    # Running sandboxes answer; paused ones resume with their memory.
    for row in rows:
        sandbox_id = row["id"]
        if row["state"] not in ("running", "paused"):
            continue
        value = read_counter(sandbox_id) if sandbox_id in model.counters else None
        if sandbox_id in model.counters:
            assert value >= model.counters[sandbox_id], (
                f"{sandbox_id} ({row['state']} after restart) counts {value}, had passed "
                f"{model.counters[sandbox_id]}: its memory was not kept"
            )
            moved = wait_until(
                f"{sandbox_id}'s counter moves on",
                lambda s=sandbox_id, v=value: (lambda now: now if now > v else None)(read_counter(s)),
            )
            model.counters[sandbox_id] = moved
        else:
            box = sdk().connect(sandbox_id, timeout=3600)
            assert box.commands.run("echo ok", timeout=60).stdout.strip() == "ok"
    return {r["id"]: r["state"] for r in warren.rows()}


# --- the matrix ------------------------------------------------------------------------------------


@dataclass
class Calibration:
    """How long each operation takes here, measured once without a crash; kill points are drawn
    from 0..1.3 x that, so most land inside the operation and a few just after it."""

    seconds: dict[str, float] = field(default_factory=dict)


def measure(warren: Warren, model: Model) -> Calibration:
    cal = Calibration()
    sandbox_id, value = start_counter(warren)
    model.counters[sandbox_id] = value
    for op in ("pause", "resume", "snapshot", "fork", "kill"):
        method, path, body = operation_request(op, sandbox_id)
        started = time.monotonic()
        status, answer = warren.api(method, path, body)
        cal.seconds[op] = time.monotonic() - started
        assert status < 300, (op, status, answer)
        if op == "fork":
            for result in answer:
                warren.api("DELETE", f"/sandboxes/{result['sandbox']['sandboxID']}")
        if op == "snapshot":
            warren.api("DELETE", f"/snapshots/{answer['snapshotID']}")
    model.counters.pop(sandbox_id)
    started = time.monotonic()
    status, body = warren.api(*operation_request("create", None))
    cal.seconds["create"] = time.monotonic() - started
    assert status == 201, (status, body)
    warren.api("DELETE", f"/sandboxes/{body['sandboxID']}")
    return cal


def pick_subject(warren: Warren, model: Model, op: str, rng: random.Random) -> str | None:
    """A sandbox in the state `op` needs (made when there is none)."""
    if op == "create":
        return None
    rows = {r["id"]: r for r in warren.rows()}
    want = "paused" if op == "resume" else "running"
    candidates = sorted(i for i in model.counters if rows.get(i, {}).get("state") == want)
    if candidates:
        return rng.choice(candidates)
    sandbox_id, value = start_counter(warren)
    model.counters[sandbox_id] = value
    if want == "paused":
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
        assert status == 204, (status, body)
    return sandbox_id


def run_matrix(kills: int, seed: int, report=print, max_live: int = 3) -> list[dict]:
    """`kills` SIGKILLs of one `warren up` at seeded random points inside seeded random operations."""
    reason = missing_prerequisite()
    if reason:
        raise RuntimeError(f"SKIP: {reason}")
    rng = random.Random(seed)
    warren = Warren()
    model = Model()
    known: set[str] = set()
    results = []
    try:
        warren.start()
        cal = measure(warren, model)
        report(f"seed {seed}; operation times here (s): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cal.seconds.items())))
        for n in range(kills):
            # A round-robin start keeps a short run covering every operation.
            op = OPERATIONS[n % len(OPERATIONS)] if n < len(OPERATIONS) else rng.choice(OPERATIONS)
            subject = pick_subject(warren, model, op, rng)
            if subject:
                known.add(subject)
                # A value the counter has certainly passed before the operation starts.
                if warren.rows() and subject in model.counters:
                    state = {r["id"]: r["state"] for r in warren.rows()}[subject]
                    if state == "running":
                        model.counters[subject] = read_counter(subject)
            delay = rng.uniform(0, 1.3 * cal.seconds[op])
            outcome = run_cut_short(warren, op, subject, delay)
            warren.start()
            states = check_after_restart(warren, model, known)
            known |= set(states)
            for sandbox_id, state in states.items():
                if state not in ("running", "paused"):
                    model.counters.pop(sandbox_id, None)
            result = {"n": n, "op": op, "delay_s": round(delay, 3), "outcome": outcome, "subject": subject,
                      "subject_state": states.get(subject) if subject else None}
            results.append(result)
            report(json.dumps(result))
            # Keep the host small: kill the oldest when too many live.
            alive = [i for i, s in states.items() if s in ("running", "paused")]
            for sandbox_id in alive[: max(0, len(alive) - max_live)]:
                warren.api("DELETE", f"/sandboxes/{sandbox_id}")
                model.counters.pop(sandbox_id, None)
        return results
    except BaseException:
        report(f"warren's log (last lines):\n{warren.log_tail(80)}")
        raise
    finally:
        try:
            warren.cleanup()
        finally:
            warren.log_path.unlink(missing_ok=True)
