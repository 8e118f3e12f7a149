"""The official E2B Python SDK, unchanged, against a real `warren up`: create a sandbox, run a command,
write and read a file, open a PTY, set a timeout, list, and kill."""

from datetime import datetime, timezone

import pytest


def test_sdk_full_flow(sdk_env):
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import PtySize

    sandbox = Sandbox.create(template="base", timeout=600, metadata={"suite": "wt-e2e-sdk"})
    try:
        # A command, with its output and exit code.
        result = sandbox.commands.run("echo hello from $(hostname) && id -un")
        assert result.exit_code == 0
        lines = result.stdout.strip().splitlines()
        assert lines[0] == f"hello from {sandbox.sandbox_id}", result.stdout
        assert lines[1] == "user", result.stdout

        from e2b import CommandExitException

        with pytest.raises(CommandExitException) as exc_info:
            sandbox.commands.run("echo oops >&2; exit 7")
        assert exc_info.value.exit_code == 7
        assert "oops" in exc_info.value.stderr

        # Files: write, read back, see it from a command, list the directory.
        content = "line one\nline two: äöü\n"
        sandbox.files.write("/home/user/wt-e2e/notes.txt", content)
        assert sandbox.files.read("/home/user/wt-e2e/notes.txt") == content
        assert sandbox.commands.run("wc -l < /home/user/wt-e2e/notes.txt").stdout.strip() == "2"
        names = [entry.name for entry in sandbox.files.list("/home/user/wt-e2e")]
        assert names == ["notes.txt"]

        # A PTY: type a command and `exit`; the shell's output comes back through the terminal.
        output = bytearray()
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
        sandbox.pty.send_stdin(terminal.pid, b"echo $((6*7))-pty\nexit\n")
        terminal.wait(on_pty=lambda data: output.extend(data))
        assert b"42-pty" in bytes(output), bytes(output)

        # Timeout: moving it changes the end time.
        sandbox.set_timeout(600)
        far_end = sandbox.get_info().end_at
        sandbox.set_timeout(60)
        near_end = sandbox.get_info().end_at
        assert near_end < far_end
        assert 500 <= (far_end - near_end).total_seconds() <= 600
        assert near_end > datetime.now(timezone.utc)

        # List: the sandbox is there, with its metadata.
        listed = _list_ids(Sandbox, {"suite": "wt-e2e-sdk"})
        assert sandbox.sandbox_id in listed
    finally:
        killed = sandbox.kill()
    assert killed is True
    assert sandbox.sandbox_id not in _list_ids(Sandbox, {"suite": "wt-e2e-sdk"})


def _list_ids(Sandbox, metadata):
    from e2b import SandboxQuery

    paginator = Sandbox.list(query=SandboxQuery(metadata=metadata))
    ids = []
    while paginator.has_next:
        ids.extend(info.sandbox_id for info in paginator.next_items())
    return ids


def test_sdk_user_can_sudo(sdk_env):
    """E2B templates run `sudo apt-get ...` as `user`: passwordless sudo works, root stays contained."""
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=120)
    try:
        result = sandbox.commands.run("sudo -n id -u && sudo -n apt-get --version | head -n 1", user="user")
        lines = result.stdout.strip().splitlines()
        assert lines[0] == "0", result.stdout
        assert lines[1].startswith("apt "), result.stdout
        assert sandbox.commands.run("id -u", user="user").stdout.strip() == "1000"
    finally:
        sandbox.kill()


def test_sdk_unknown_template_is_a_clear_error(sdk_env):
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with pytest.raises(SandboxException) as exc_info:
        Sandbox.create(template="wt-no-such-template")
    assert "wt-no-such-template" in str(exc_info.value) or "not found" in str(exc_info.value).lower()


def test_sdk_wrong_key_is_refused(sdk_env, monkeypatch):
    from e2b import Sandbox
    from e2b.exceptions import AuthenticationException

    monkeypatch.setenv("E2B_API_KEY", "e2b_wt_not_a_real_key")
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="base")
