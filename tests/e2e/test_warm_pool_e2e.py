"""Warm pools against a real `warren up` (conftest.py starts it with `--warm-pool wt-e2e-pooled=2`):
a running-state template's sandboxes wait restored and frozen; a create takes one, and what it gets
cannot be told from a fresh restore: its own hostname, environment, token, clock and files, the
template's server still running. A template that goes takes its pool with it."""

import time

import httpx


TEMPLATE = "wt-e2e-pooled"


def _pool_size(sdk_env) -> int:
    text = httpx.get(f"{sdk_env['E2B_API_URL']}/metrics", headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
                     timeout=30).text
    for line in text.splitlines():
        if line.startswith(f'warren_warm_pool_sandboxes{{template="{TEMPLATE}"}}'):
            return int(float(line.split()[-1]))
    return 0


def _wait_pool(sdk_env, size: int, bound_s: float = 120) -> None:
    deadline = time.monotonic() + bound_s
    while _pool_size(sdk_env) != size:
        assert time.monotonic() < deadline, f"the pool did not reach {size}"
        time.sleep(0.2)


def test_pooled_sandboxes_are_handed_out_as_fresh_ones(sdk_env, warren):
    from e2b import Sandbox, Template, wait_for_port

    template = (
        Template()
        .from_image("debian:bookworm")
        .run_cmd("echo from-the-template > /home/user/built.txt")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    Template.build(template, alias=TEMPLATE)
    try:
        Sandbox.create(template=TEMPLATE, timeout=60).kill()  # wakes the pool's filler
        _wait_pool(sdk_env, 2)
        a = Sandbox.create(template=TEMPLATE, timeout=300, envs={"WHO": "a"}, metadata={"suite": "wt-pool"},
                           secure=True)
        b = Sandbox.create(template=TEMPLATE, timeout=300, envs={"WHO": "b"}, metadata={"suite": "wt-pool"},
                           secure=True)
        try:
            with httpx.Client(base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
                              timeout=30) as api:
                for sandbox in (a, b):
                    events = api.get(f"/events/sandboxes/{sandbox.sandbox_id}").json()
                    reasons = [str(e.get("eventData", {}).get("reason")) for e in events]
                    assert any("warm pool" in r for r in reasons), reasons
            for sandbox, who in ((a, "a"), (b, "b")):
                out = sandbox.commands.run(
                    "hostname; echo $WHO; cat /home/user/built.txt; date +%s; "
                    "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/").stdout.split()
                assert out[0] == sandbox.sandbox_id, out
                assert out[1] == who, out
                assert out[2] == "from-the-template", out
                assert abs(int(out[3]) - time.time()) < 10, ("the clock inside", out)
                assert out[4] == "200", out
                info = sandbox.get_info()
                assert info.metadata.get("suite") == "wt-pool", info
                assert 250 < (info.end_at - info.started_at).total_seconds() <= 300, info
            a.files.write("/tmp/only-a", "a")
            assert not b.files.exists("/tmp/only-a")
            # secure=True: the agent wants this sandbox's token and no other's.
            assert a._envd_access_token and a._envd_access_token != b._envd_access_token
            # The pool fills back up with new sandboxes.
            _wait_pool(sdk_env, 2)
        finally:
            a.kill()
            b.kill()
    finally:
        deleted = warren.cli("template", "delete", TEMPLATE, "--force")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    # Its members go with it.
    _wait_pool(sdk_env, 0, bound_s=60)
