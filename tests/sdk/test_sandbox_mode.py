"""The static agent in sandbox mode: PID 1 of its own PID and mount namespaces, chrooted into an
overlay of the Debian base rootfs (`/` is its root, real `user` account, sudo, bash), reached with
the official SDK. Skips where the rootfs or root is missing."""

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import httpx
import pytest
from packaging.version import Version

from e2b import CommandExitException, PtySize, Sandbox
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import SandboxException

from conftest import ENVD_VERSION, IS_ROOT, wait_until

ROOTFS = pathlib.Path(os.environ.get("WARREN_CACHE", "/var/cache/warren")) / "rootfs" / "debian12-base"
HELPER = pathlib.Path(__file__).resolve().parent / "chroot_agent.sh"


@pytest.fixture
def chrooted(agent_binary):
    if not IS_ROOT or shutil.which("unshare") is None or not (ROOTFS / "bin" / "bash").exists():
        pytest.skip(f"SKIP: needs root, unshare(1) and the base rootfs at {ROOTFS}")
    work = tempfile.mkdtemp(prefix="wt-agent-chroot-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", str(HELPER), agent_binary, str(port), work, str(ROOTFS)]
    )
    url = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 204
        except httpx.TransportError:
            return proc.poll() is not None

    wait_until(healthy, "the chrooted agent")
    assert proc.poll() is None, "the chrooted agent exited"
    config = ConnectionConfig(sandbox_url=url, api_key="wt-unused")
    sbx = Sandbox(
        sandbox_id="wt-chroot-agent",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=None,
        connection_config=config,
    )
    yield proc, sbx
    if proc.poll() is None:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = f.read().split()
        if children:
            os.kill(int(children[0]), 15)
        proc.wait(timeout=60)
    shutil.rmtree(work, ignore_errors=True)


def test_sandbox_mode_end_to_end(chrooted):
    proc, sbx = chrooted
    out = sbx.commands.run("id -u; id -un; pwd; echo $HOME; echo $PPID").stdout.split()
    assert out == ["1000", "user", "/home/user", "/home/user", "1"]
    assert sbx.commands.run("id -un", user="root").stdout == "root\n"
    sbx.files.write("hello.txt", "in sandbox")
    info = sbx.files.get_info("/home/user/hello.txt")
    assert (info.owner, info.group, info.size) == ("user", "user", 10)
    assert sbx.commands.run("cat ~/hello.txt").stdout == "in sandbox"
    with pytest.raises(SandboxException):
        sbx.files.read("../../etc/shadow")
    assert sbx.files.read("/etc/shadow", user="root").startswith("root:")

    screen = []
    pty = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(pty.pid, b"tty; whoami; exit\n")
    try:
        pty.wait(on_pty=screen.append)
    except CommandExitException:
        pass
    text = b"".join(screen).decode(errors="replace")
    assert "/dev/pts/" in text and "user" in text

    sbx.commands.run("for i in $(seq 10); do sh -c 'sleep 0.01 &'; done")

    def no_zombies():
        stats = sbx.commands.run("cat /proc/[0-9]*/stat 2>/dev/null || true").stdout
        return all(line.rsplit(")", 1)[1].split()[0] != "Z" for line in stats.splitlines() if ")" in line)

    wait_until(no_zombies, "orphans to be reaped")
    # SIGTERM to PID 1: children get it, the agent exits 0.
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        os.kill(int(f.read().split()[0]), 15)
    assert proc.wait(timeout=60) == 0
