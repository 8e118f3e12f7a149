"""Places where Warren must answer the official SDK the way E2B does (issue 17), against a real
`warren up`: each test drives the unmodified `e2b` SDK and checks what E2B's answer would be.
docs/compatibility.md names each test next to the behaviour it checks."""

import pytest


def _running_ids(Sandbox, metadata):
    from e2b import SandboxQuery

    paginator = Sandbox.list(query=SandboxQuery(metadata=metadata))
    ids = []
    while paginator.has_next:
        ids.extend(info.sandbox_id for info in paginator.next_items())
    return ids


def test_set_timeout_zero_ends_the_sandbox_now(sdk_env):
    from e2b import Sandbox
    from e2b.exceptions import SandboxNotFoundException

    meta = {"suite": "wt-e2e-timeout-zero"}
    sandbox = Sandbox.create(template="base", timeout=600, metadata=meta)
    try:
        assert sandbox.is_running()
        sandbox.set_timeout(0)
        # Ended by the call itself, not by the scheduler later: gone from the list at once.
        assert sandbox.sandbox_id not in _running_ids(Sandbox, meta)
        assert sandbox.is_running() is False
        with pytest.raises(SandboxNotFoundException):
            sandbox.get_info()
    finally:
        sandbox.kill()


def test_commands_after_kill_say_the_sandbox_was_killed(sdk_env):
    from e2b import Sandbox
    from e2b.exceptions import SandboxNotRunningException

    sandbox = Sandbox.create(template="base", timeout=600)
    assert sandbox.commands.run("true").exit_code == 0
    assert sandbox.kill() is True
    # The proxy answers "... was not found" at once, which the SDK reports as killed / timed out.
    assert sandbox.is_running() is False
    with pytest.raises(SandboxNotRunningException) as exc_info:
        sandbox.commands.run("true")
    assert "killed or reached its timeout" in str(exc_info.value)


def test_requests_during_a_kill_say_the_sandbox_was_killed(sdk_env):
    """A sandbox leaves the proxy's routes when its kill begins: requests sent while the kill is under
    way get the "not found" answer (killed), never "port is not open" or a hang (unreachable)."""
    import threading

    from e2b import Sandbox
    from e2b.exceptions import SandboxNotRunningException, SandboxUnreachableException

    sandbox = Sandbox.create(template="base", timeout=600)
    killer = threading.Thread(target=sandbox.kill)
    assert sandbox.commands.run("true").exit_code == 0
    killer.start()
    try:
        failure = None
        for _ in range(10_000):
            try:
                sandbox.commands.run("true", request_timeout=60)
            except (SandboxNotRunningException, SandboxUnreachableException) as error:
                failure = error
                break
        assert isinstance(failure, SandboxNotRunningException), repr(failure)
    finally:
        killer.join(timeout=120)
    assert not killer.is_alive()
