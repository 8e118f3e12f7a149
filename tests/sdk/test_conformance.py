"""Places where the agent must answer the official SDK the way envd does (issue 17), against a
host-mode agent. docs/compatibility.md names each test next to the behaviour it checks."""

import os

import pytest
from e2b import CommandExitException, TimeoutException

from conftest import IS_ROOT, USER_UID


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_returns_once_the_process_is_gone(sbx):
    # In host mode the pid the SDK sees is a host pid, so this process can probe it directly.
    for _ in range(5):
        handle = sbx.commands.run("trap '' TERM; sleep 60", background=True)
        assert _alive(handle.pid)
        assert sbx.commands.kill(handle.pid) is True
        assert not _alive(handle.pid), "commands.kill returned while the process still existed"
        with pytest.raises(CommandExitException):
            handle.wait()


def test_a_timed_out_command_is_a_timeout_never_an_exit_code(sbx):
    # Repeated: the end the timeout causes (killed, -1) used to race the timeout's own report.
    for _ in range(15):
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 30", timeout=0.3)
