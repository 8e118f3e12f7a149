"""Stored secrets through the official SDK against `warren up` (docs/secrets.md): `Secret.fill(name)`
in a sandbox's `envs` reaches its processes' environment, in a header rule it reaches the test's own
upstream (in the egress tests' private namespace, 198.18.0.0/15) but never the sandbox; no API
answer, event or line of the server's log carries a value; an update reaches new sandboxes and new
requests; an unknown placeholder is a 400 naming it."""

import hashlib
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import ALL_TRAFFIC, Sandbox, Secret

from test_egress_e2e import internet  # noqa: F401  (the module's test "internet" fixture)


def _api_texts(warren, sandbox_id: str) -> str:
    """Every answer that could show a sandbox or a secret, raw."""
    headers = {"X-API-Key": warren.env["E2B_API_KEY"]}
    paths = [
        f"/sandboxes/{sandbox_id}",
        "/sandboxes",
        "/v2/sandboxes",
        f"/events/sandboxes/{sandbox_id}",
        "/events/sandboxes",
        "/secrets",
        f"/sandboxes/{sandbox_id}/logs",
    ]
    texts = []
    for path in paths:
        answer = httpx.get(warren.api_url + path, headers=headers, timeout=30)
        assert answer.status_code == 200, (path, answer.status_code, answer.text)
        texts.append(answer.text)
    return "\n".join(texts)


def _database_bytes(warren) -> bytes:
    return b"".join(p.read_bytes() for p in Path(warren.state_dir).glob("warren.db*"))


def _digest_of(sandbox, variable: str) -> str:
    """The SHA-256 of an environment variable as a command in the sandbox sees it: the value itself
    is never printed, since the sandbox's output is kept in its logs (GET /sandboxes/{id}/logs)."""
    out = sandbox.commands.run(f'printf %s "${variable}" | sha256sum').stdout
    return out.split()[0]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _paged(paginator):
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def test_a_secret_reaches_the_process_environment_and_no_api_answer_or_log(sdk_env, warren):
    name = f"e2e-env-{uuid.uuid4().hex[:8]}"
    value = f"e2e-env-value-{uuid.uuid4().hex}"
    value2 = f"e2e-env-rotated-{uuid.uuid4().hex}"
    info = Secret.create(name, value, metadata={"purpose": "e2e"})
    sandboxes = []
    try:
        assert info.name == name and info.version == 1 and info.metadata == {"purpose": "e2e"}
        assert value not in repr(info)

        sandbox = Sandbox.create(envs={"K": Secret.fill(name), "L": f"pre-{Secret.fill(name)}"}, timeout=300)
        sandboxes.append(sandbox)
        assert _digest_of(sandbox, "K") == _sha(value)
        assert _digest_of(sandbox, "L") == _sha(f"pre-{value}")

        # Nothing the API answers carries it: the SDK's views, and every raw answer.
        assert value not in repr(sandbox.get_info())
        assert value not in repr(_paged(Sandbox.list()))
        assert value not in repr(_paged(Secret.list()))
        assert value not in repr(Secret.get_info(name))
        assert value not in _api_texts(warren, sandbox.sandbox_id)

        # A new value: a new version, used by sandboxes made from now on (and by the first one's
        # new commands once it is resumed: the agent gets the current value at every start).
        updated = Secret.update(name, value2)
        assert updated.version == 2 and updated.secret_id == info.secret_id
        fresh = Sandbox.create(envs={"K": Secret.fill(name)}, timeout=300)
        sandboxes.append(fresh)
        assert _digest_of(fresh, "K") == _sha(value2)

        sandbox.beta_pause()
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert _digest_of(resumed, "K") == _sha(value2)
        assert value2 not in _api_texts(warren, sandbox.sandbox_id)

        # An unknown placeholder is a 400 that names it.
        with pytest.raises(Exception, match=r"400.*\$\{e2b\.secrets\.nope-e2e\} names no secret"):
            Sandbox.create(envs={"K": Secret.fill("nope-e2e")}, timeout=60)
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
        assert Secret.destroy(name)
    assert not Secret.exists(name)
    log = warren.log()
    for secret in (value, value2):
        assert secret not in log, "a value in the server's log"
        assert secret.encode() not in _database_bytes(warren), "a value in clear in the database"


def test_a_secret_in_a_header_rule_reaches_the_upstream_but_never_the_sandbox(sdk_env, warren, internet):  # noqa: F811
    b, c = internet["b"], internet["c"]
    name = f"e2e-hdr-{uuid.uuid4().hex[:8]}"
    value = f"e2e-hdr-value-{uuid.uuid4().hex}"
    value2 = f"e2e-hdr-rotated-{uuid.uuid4().hex}"
    Secret.create(name, value)
    sandbox = Sandbox.create(
        network={
            "allow_out": ["api.allowed.test"],
            "deny_out": [ALL_TRAFFIC],
            "rules": {"api.allowed.test": [
                {"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}"}}},
            ]},
        },
        timeout=300,
    )
    # The upstream answers with the Authorization it got; only its digest is printed, since the
    # sandbox's output is kept in its logs.
    curl = (
        f"curl -s -S -m 5 --resolve api.allowed.test:443:{b} https://api.allowed.test/ 2>&1 "
        "| sha256sum || true"
    )

    def upstream_saw(text: str) -> bool:
        return sandbox.commands.run(curl, timeout=30).stdout.split()[0] == _sha(text)

    try:
        assert upstream_saw(f"served-by {c} auth=Bearer {value}")
        # Split in the command line so the command (kept in the logs) does not hold it either.
        half = len(value) // 2
        found = sandbox.commands.run(
            f"grep -rsl '{value[:half]}''{value[half:]}' /etc /tmp /root /home "
            "/proc/1/environ /proc/self/environ || true",
            user="root",
        ).stdout.strip()
        assert found == "", f"the value is inside the sandbox: {found}"
        assert "Authorization" not in sandbox.commands.run("env").stdout
        assert value not in _api_texts(warren, sandbox.sandbox_id)

        # An update reaches the running sandbox's next requests.
        Secret.update(name, value2)
        assert upstream_saw(f"served-by {c} auth=Bearer {value2}")

        # Deleted: the running sandbox's rule keeps the value it was given (docs/secrets.md).
        assert Secret.destroy(name)
        assert upstream_saw(f"served-by {c} auth=Bearer {value2}")
        assert value2 not in _api_texts(warren, sandbox.sandbox_id)
    finally:
        sandbox.kill()
        Secret.destroy(name)
    log = warren.log()
    for secret in (value, value2):
        assert secret not in log, "a value in the server's log"
