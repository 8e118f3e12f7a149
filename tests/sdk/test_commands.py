"""Commands through the official SDK against a host-mode agent."""

import threading
import pytest
from e2b import CommandExitException, TimeoutException
from e2b.exceptions import NotFoundException

from conftest import IS_ROOT, USER_UID, wait_until


def test_run_streams_stdout_and_stderr(sbx):
    out, err = [], []
    result = sbx.commands.run(
        "echo one; echo two >&2; printf 'three'",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "one\nthree"
    assert result.stderr == "two\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == result.stderr


def test_nonzero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo oops >&2; exit 7")
    assert info.value.exit_code == 7
    assert info.value.stderr == "oops\n"
    assert info.value.error == "exit status 7"


def test_envs_and_cwd(sbx, shared_agent):
    (shared_agent.root / "tmp" / "wd").mkdir(exist_ok=True)
    result = sbx.commands.run('echo "$GREETING"; pwd', envs={"GREETING": "hi there"}, cwd="/tmp/wd")
    lines = result.stdout.splitlines()
    assert lines[0] == "hi there"
    assert lines[1] == str(shared_agent.root / "tmp" / "wd")


def test_missing_cwd_is_invalid_argument(sbx):
    from e2b.exceptions import InvalidArgumentException

    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("true", cwd="/does/not/exist")


def test_background_list_connect_and_kill(sbx):
    handle = sbx.commands.run("echo started; sleep 30", background=True)
    assert handle.pid > 0
    listed = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in listed
    assert listed[handle.pid].cmd == "/bin/bash"
    again = sbx.commands.connect(handle.pid)
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as info:
        again.wait()
    assert info.value.exit_code == -1
    assert "killed" in (info.value.error or "")
    wait_until(lambda: handle.pid not in {p.pid for p in sbx.commands.list()}, "process to leave the list")
    assert sbx.commands.kill(handle.pid) is False


def test_connect_to_unknown_pid_is_not_found(sbx):
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_999)


def test_stdin_send_and_close(sbx):
    handle = sbx.commands.run("cat", background=True, stdin=True)
    handle.send_stdin("line one\n")
    sbx.commands.send_stdin(handle.pid, b"line two\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "line one\nline two\n"


def test_stream_input(sbx):
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(handle.pid, [b"a", "b", b"c\n"])
    handle.close_stdin()
    assert handle.wait().stdout == "abc\n"


def test_kill_from_the_handle_ends_wait(sbx):
    handle = sbx.commands.run("echo ready; while true; do sleep 0.1; done", background=True)
    errors = []

    def waiter():
        try:
            handle.wait()
        except CommandExitException as e:
            errors.append(e)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    assert handle.kill() is True
    t.join(30)
    assert not t.is_alive()
    assert errors and errors[0].exit_code == -1


def test_timeout_kills_the_command(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30 # wt-timeout-probe", timeout=0.5)
    # The agent kills the process at the deadline: it leaves the process list.
    def gone():
        return not any("wt-timeout-probe" in " ".join(p.args) for p in sbx.commands.list())
    wait_until(gone, "the timed-out command to be killed")


def test_runs_as_requested_user(sbx, shared_agent):
    if not IS_ROOT:
        print("SKIP: switching users needs the agent to run as root")
        return
    assert sbx.commands.run("id -u").stdout.strip() == str(USER_UID)
    assert sbx.commands.run("id -u", user="root").stdout.strip() == "0"
    assert sbx.commands.run("echo $USER:$HOME", user="user").stdout.strip() == f"user:{shared_agent.home()}"
    sbx.commands.run("echo x > owned-by-user.txt")
    assert (shared_agent.home() / "owned-by-user.txt").stat().st_uid == USER_UID


def test_orphans_are_reaped(sbx):
    # A grandchild orphaned by its parent is reparented to the agent (subreaper) and reaped.
    result = sbx.commands.run("sh -c 'sleep 0.2 & echo $!'")
    orphan = int(result.stdout.strip())
    def gone():
        try:
            open(f"/proc/{orphan}/stat").close()
            return False  # still running, or a zombie nobody reaped
        except FileNotFoundError:
            return True
    wait_until(gone, "orphan to be reaped", attempts=100, pause=0.1)


def test_unknown_user_is_rejected(sbx):
    from e2b.exceptions import AuthenticationException

    with pytest.raises(AuthenticationException):
        sbx.commands.run("true", user="nobody-such")
