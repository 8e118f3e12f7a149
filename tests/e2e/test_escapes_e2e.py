"""Escape battery, the parts that need the real agent (the runtime's own battery,
crates/runtime/tests/escape_battery.rs, runs a stand-in): a process inside, as root or as the
sandbox's user, tries to ptrace the agent (PID 1) or read its memory, environment and descriptors.
The agent is not dumpable, so all of it needs CAP_SYS_PTRACE, which no sandbox process has; ptrace of
the sandbox's own programs still works (debuggers, strace). The flag survives pause/resume (CRIU
restores it)."""

import json
import urllib.request

import pytest

PROBE = r"""python3 - <<'EOF'
import ctypes, errno, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
def err():
    return errno.errorcode[ctypes.get_errno()]
def attach(pid):
    r = libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None)  # PTRACE_ATTACH
    return "ok" if r == 0 else err()
out = {}
out["attach_agent"] = attach(1)
r = libc.ptrace(ctypes.c_long(0x4206), ctypes.c_long(1), None, None)  # PTRACE_SEIZE
out["seize_agent"] = "ok" if r == 0 else err()
for name in ["mem", "environ"]:
    try:
        open("/proc/1/" + name, "rb").read(1)
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
# Listing /proc/1/fd is a directory read (CAP_DAC_OVERRIDE allows it); following an entry is not.
try:
    fds = os.listdir("/proc/1/fd")
    os.readlink("/proc/1/fd/" + fds[0])
    os.open("/proc/1/fd/" + fds[0], os.O_RDONLY)
    out["fd"] = "ok"
except OSError as e:
    out["fd"] = errno.errorcode[e.errno]
pidfd = libc.syscall(434, 1, 0)  # pidfd_open(1)
got = libc.syscall(438, pidfd, 0, 0) if pidfd >= 0 else -1  # pidfd_getfd(pidfd, 0)
out["getfd"] = "ok" if got >= 0 else err()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
out["attach_own_child"] = attach(child)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
print(" ".join(f"{k}={v}" for k, v in out.items()))
EOF"""

REFUSED = {"attach_agent", "seize_agent", "mem", "environ", "fd", "getfd"}


def _check(sandbox, user):
    result = sandbox.commands.run(PROBE, user=user)
    answers = dict(item.split("=") for item in result.stdout.split())
    for key in REFUSED:
        assert answers[key] in ("EPERM", "EACCES"), (user, key, answers)
    assert answers["attach_own_child"] == "ok", (user, answers)


def test_no_sandbox_process_can_ptrace_or_read_the_agent(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=300, metadata={"suite": "wt-escapes"})
    try:
        _check(sandbox, "root")
        _check(sandbox, "user")
        with urllib.request.urlopen(f"{sdk_env['E2B_API_URL']}/health", timeout=30) as answer:
            checkpoint = json.load(answer).get("checkpoint")
        if not checkpoint:
            print("SKIP (pause part): this host cannot take CRIU checkpoints")
            return
        sandbox.beta_pause()
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        _check(resumed, "root")
    finally:
        sandbox.kill()


def test_a_symlink_swapped_in_during_uploads_lends_the_user_nothing(sdk_env):
    """The agent makes a written file's missing parents as root (as envd does, so a user can write
    `/0/a/b.txt`). A link the user planted, or swaps in while uploads run, must not turn that into a
    directory the user owns in a place only root may write (here /etc)."""
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=300, metadata={"suite": "wt-escapes"})
    try:
        # A link in place before the write: refused, nothing made under /etc.
        sandbox.commands.run("ln -s /etc /home/user/flip", user="user")
        with pytest.raises(Exception):
            sandbox.files.write("/home/user/flip/wt-static/file", "x", user="user")
        sandbox.commands.run("rm /home/user/flip", user="user")
        # The same path flipping between a real directory and the link while uploads run, single
        # files and multipart batches both.
        flipper = sandbox.commands.run(
            "while :; do mkdir /home/user/flip; rm -rf /home/user/flip; "
            "ln -s /etc /home/user/flip; rm -f /home/user/flip; done",
            user="user",
            background=True,
        )
        outcomes = {"written": 0, "refused": 0}
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        for i in range(150):
            try:
                if i % 3 == 0:
                    sandbox.files.write_files(
                        [
                            WriteEntry(path=f"/home/user/flip/wt-{i}/a", data="x"),
                            WriteEntry(path=f"/home/user/flip/wt-{i}/b/c", data="y"),
                        ],
                        user="user",
                    )
                else:
                    sandbox.files.write(f"/home/user/flip/wt-{i}/file", "x", user="user")
                outcomes["written"] += 1
            except Exception:
                outcomes["refused"] += 1
        flipper.kill()
        print("uploads during the flips:", outcomes)
        leaked = sandbox.commands.run("ls -d /etc/wt-* 2>/dev/null; true", user="root").stdout
        assert leaked.strip() == "", leaked
    finally:
        sandbox.kill()
