"""Fixtures that run warren-agent in host mode and point the official e2b SDK at it.

The SDK's `Sandbox` normally learns its envd URL, version and access token from the control
plane. These tests have no control plane: they build the `Sandbox` object directly with a
`ConnectionConfig(sandbox_url=<agent URL>)` and Warren's reported envd version, which is exactly
what `Sandbox.create()` does after the REST call. Everything after that (commands, PTY, files,
watch) is the SDK's own unmodified code path. See README.md.
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import httpx
import pytest
from packaging.version import Version

from e2b import Sandbox
from e2b.connection_config import ConnectionConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
# Mirrors warren_proto::envd::ENVD_VERSION; checked against the agent's X-Envd-Version header.
ENVD_VERSION = "0.6.4"
USER_UID = 1000
IS_ROOT = os.geteuid() == 0


def _agent_binary() -> str:
    explicit = os.environ.get("WARREN_AGENT_BIN")
    if explicit:
        return explicit
    out = subprocess.run(
        [str(REPO / "scripts" / "build-agent")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def agent_binary() -> str:
    path = _agent_binary()
    assert os.access(path, os.X_OK), f"agent binary {path} is not executable"
    return path


def make_root() -> pathlib.Path:
    """A directory standing for the sandbox's `/`: passwd/group with `root` and `user`
    (uid 1000), /home/user owned by user, a root-only /etc/shadow, a world-writable /tmp."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="wt-agent-"))
    root.chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        f"user:x:{USER_UID}:{USER_UID}::/home/user:/bin/bash\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\nsudo:x:27:user\nuser:x:{USER_UID}:\n")
    shadow = root / "etc" / "shadow"
    shadow.write_text("root:*:19000:0:99999:7:::\n")
    shadow.chmod(0o600)
    (root / "root").mkdir(mode=0o700)
    home = root / "home" / "user"
    home.mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    if IS_ROOT:
        os.chown(home, USER_UID, USER_UID)
    return root


class RunningAgent:
    def __init__(self, binary: str, wrapper=()):
        self.root = make_root()
        self.wrapped = bool(wrapper)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(self.root.parent / f"{self.root.name}.log", "w+")
        self.proc = subprocess.Popen(
            [*wrapper, binary, "--listen", f"127.0.0.1:{self.port}", "--root", str(self.root)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(200):
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 204:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"warren-agent did not become healthy; log:\n{self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()

    def home(self) -> pathlib.Path:
        return self.root / "home" / "user"

    def sandbox(self, access_token=None, cls=Sandbox):
        headers = {"E2b-Sandbox-Id": "wt-host-agent", "E2b-Sandbox-Port": "49983"}
        if access_token:
            headers["X-Access-Token"] = access_token
        config = ConnectionConfig(
            sandbox_url=self.url,
            api_key="wt-unused",
            extra_sandbox_headers=headers,
        )
        return cls(
            sandbox_id="wt-host-agent",
            sandbox_domain=None,
            envd_version=Version(ENVD_VERSION),
            envd_access_token=access_token,
            connection_config=config,
        )

    def stop(self):
        if self.proc.poll() is None:
            # With a wrapper (unshare), SIGTERM goes to the agent itself, its only child.
            target = self.proc.pid
            if self.wrapped:
                try:
                    with open(f"/proc/{target}/task/{target}/children") as f:
                        target = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
            os.kill(target, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_agent(agent_binary):
    agent = RunningAgent(agent_binary)
    yield agent
    agent.stop()


@pytest.fixture
def fresh_agent(agent_binary):
    """An agent of its own, for tests that change its state (/init, tokens, signals)."""
    agent = RunningAgent(agent_binary)
    yield agent
    agent.stop()


@pytest.fixture
def sbx(shared_agent) -> Sandbox:
    return shared_agent.sandbox()


def wait_until(predicate, what, attempts=200, pause=0.05):
    """Polls `predicate` a bounded number of times (no timing is asserted)."""
    for _ in range(attempts):
        if predicate():
            return
        time.sleep(pause)
    raise AssertionError(f"gave up waiting for {what}")
