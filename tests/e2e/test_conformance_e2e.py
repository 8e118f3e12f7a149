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


def test_signed_file_urls_work_with_e2b_sandbox_url_and_with_domains(sdk_env, monkeypatch):
    """With E2B_SANDBOX_URL the SDK's signed URLs carry no sandbox ID (no header, no host name): the
    proxy finds the sandbox from the signature. With a domain they name it in the host."""
    import urllib.parse

    import httpx
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=600, secure=True)
    try:
        sandbox.files.write("/home/user/signed.txt", "signed content\n")
        # Header mode (E2B_SANDBOX_URL): the URL is the proxy's own address.
        url = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=600)
        assert url.startswith(sdk_env["E2B_SANDBOX_URL"]) and "signature=" in url, url
        assert sandbox.sandbox_id not in url
        got = httpx.get(url, timeout=60)
        assert got.status_code == 200, got.text
        assert got.text == "signed content\n"
        up = sandbox.upload_url("/home/user/uploaded.txt")
        sent = httpx.post(up, files={"file": ("uploaded.txt", b"from a bare client\n")}, timeout=60)
        assert sent.status_code == 200, sent.text
        assert sandbox.files.read("/home/user/uploaded.txt") == "from a bare client\n"
        # A signature no sandbox made is refused, not routed.
        forged = url.replace("signature=v1_", "signature=v1_x")
        assert httpx.get(forged, timeout=60).status_code == 401

        # Domain mode: the same sandbox seen by an SDK without E2B_SANDBOX_URL names itself in the host.
        monkeypatch.delenv("E2B_SANDBOX_URL")
        by_domain = Sandbox.connect(sandbox.sandbox_id)
        durl = urllib.parse.urlsplit(by_domain.download_url("/home/user/signed.txt"))
        assert durl.hostname.startswith(f"49983-{sandbox.sandbox_id}."), durl
        # Sent to the proxy on loopback with that host name (nothing leaves the machine).
        got = httpx.get(
            f"{sdk_env['E2B_SANDBOX_URL']}{durl.path}?{durl.query}", headers={"Host": durl.netloc}, timeout=60
        )
        assert got.status_code == 200, got.text
        assert got.text == "signed content\n"
    finally:
        sandbox.kill()


def test_base_has_python_and_user_and_is_a_template_to_build_on(sdk_env):
    from e2b import Sandbox, Template

    sandbox = Sandbox.create(template="base", timeout=600)
    try:
        # `python script.py` works, as on E2B's base.
        assert sandbox.commands.run("python -c 'print(6 * 7)'").stdout == "42\n"
        who = sandbox.commands.run("id -un; echo $HOME; pwd").stdout.split()
        assert who == ["user", "/home/user", "/home/user"], who
        # E2B's `user` has passwordless sudo, and so does Warren's.
        assert sandbox.commands.run("sudo -n id -u").stdout == "0\n"
        assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    finally:
        sandbox.kill()
    # `base` is a real template others build on.
    built = Template.build(
        Template().from_template("base").run_cmd("echo built-on-base > /home/user/from-base.txt"),
        alias="wt-e2e-from-base",
    )
    child = Sandbox.create(template=built.template_id, timeout=120)
    try:
        assert child.commands.run("cat /home/user/from-base.txt").stdout == "built-on-base\n"
        assert child.commands.run("id -un").stdout == "user\n"
    finally:
        child.kill()
