"""Fleet operations through the official SDK against a real `warren up` (docs/operations.md):
`nproc` and `free` inside a sandbox tell its own limits, also after pause and resume; a user's
workspace calls, made at once, give one sandbox that the SDK can connect to."""

from concurrent.futures import ThreadPoolExecutor


def _admin(sdk_env):
    import httpx

    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"],
        headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
        timeout=120,
    )


def _own_view(sandbox):
    nproc = int(sandbox.commands.run("nproc").stdout.strip())
    mem_mib = int(sandbox.commands.run("free -m | awk '/^Mem:/ {print $2}'").stdout.strip())
    return nproc, mem_mib


def test_nproc_and_free_show_the_sandbox_limits_across_pause(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=300, metadata={"suite": "wt-ops"})
    try:
        info = sandbox.get_info()
        with _admin(sdk_env) as admin:
            detail = admin.get(f"/sandboxes/{sandbox.sandbox_id}").json()
        expected = (detail["cpuCount"], detail["memoryMB"])
        assert _own_view(sandbox) == expected, info
        sandbox.pause()
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert _own_view(resumed) == expected
    finally:
        sandbox.kill()


def test_concurrent_workspace_calls_give_one_sandbox(sdk_env):
    from e2b import Sandbox

    user = "wt-ops-alice"
    with _admin(sdk_env) as admin:
        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(
                pool.map(lambda _: admin.post(f"/workspaces/{user}/sandbox"), range(10))
            )
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        ids = {a.json()["sandbox"]["sandboxID"] for a in answers}
        assert len(ids) == 1, ids
        assert sorted(a.json()["action"] for a in answers).count("created") == 1
        sandbox_id = ids.pop()
        sandbox = Sandbox.connect(sandbox_id)
        try:
            assert sandbox.commands.run("echo mine").stdout == "mine\n"
            history = admin.get(f"/workspaces/{user}/history").json()
            assert [m["action"] for m in history["history"]] == ["created"]
        finally:
            sandbox.kill()
        replaced = admin.post(f"/workspaces/{user}/sandbox").json()
        assert replaced["action"] == "replaced"
        Sandbox.connect(replaced["sandbox"]["sandboxID"]).kill()
