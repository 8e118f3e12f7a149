"""Per-template privileges (issue 14): CAP_NET_RAW and io_uring are off in every sandbox unless an
admin builds a template that asks for them. Both ways a sandbox of a template begins are checked: a
fresh start on its layers (no start command) and a restore of the checkpoint its build left (start
command). Only admin keys may ask, and an unknown privilege is refused by name."""

import tempfile
import uuid
from pathlib import Path

# As root inside: is CAP_NET_RAW in the bounding set, can a packet socket be opened (opening sends
# nothing), and what does io_uring_setup answer.
PROBE = r"""python3 - <<'EOF'
import ctypes, errno, os, socket
bounding = int([l for l in open("/proc/self/status") if l.startswith("CapBnd")][0].split()[1], 16)
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    packet = "ok"
except OSError as e:
    packet = errno.errorcode[e.errno]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(425, 4, ctypes.create_string_buffer(120))
uring = "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
print("net_raw", bool(bounding >> 13 & 1), "packet", packet, "io_uring", uring)
EOF"""

DEFAULT = "net_raw False packet EPERM io_uring EPERM"
GRANTED = "net_raw True packet ok io_uring ok"


def _client(sdk_env, key):
    import httpx

    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": key}, timeout=60
    )


def _probe(template):
    from e2b import Sandbox

    sandbox = Sandbox.create(template=template, timeout=300, metadata={"suite": "wt-privileges"})
    try:
        result = sandbox.commands.run(PROBE, user="root")
        return result.stdout.strip()
    finally:
        sandbox.kill()


def test_only_an_admin_key_asks_for_privileges_and_unknown_ones_are_named(sdk_env):
    team = f"wt-priv-{uuid.uuid4().hex[:8]}"
    with _client(sdk_env, sdk_env["E2B_API_KEY"]) as admin:
        assert admin.post("/teams", json={"name": team}).status_code == 201
        made = admin.post("/api-keys", json={"name": "priv", "teamID": team})
        assert made.status_code == 201, made.text
        team_key = made.json()["key"]
        unknown = admin.post(
            "/v3/templates", json={"name": "wt-priv-unknown", "privileges": {"ptrace": True}}
        )
        assert unknown.status_code in (400, 422), unknown.text
        assert "ptrace" in unknown.text, unknown.text
    with _client(sdk_env, team_key) as member:
        for path, body in [
            ("/v3/templates", {"name": "wt-priv-member", "privileges": {"rawSockets": True}}),
            ("/templates", {"dockerfile": "FROM debian:bookworm\n", "privileges": {"ioUring": True}}),
        ]:
            refused = member.post(path, json=body)
            assert refused.status_code == 403, (path, refused.text)
            assert "admin" in refused.text and "privileges" in refused.text, refused.text
        # Without privileges the same key builds as before.
        plain = member.post("/v3/templates", json={"name": "wt-priv-member"})
        assert plain.status_code == 202, plain.text


def test_privileges_reach_fresh_and_checkpointed_sandboxes_of_that_template_only(warren):
    assert _probe("base") == DEFAULT
    names = {"wt-priv-plain": None, "wt-priv-started": "sleep infinity"}
    for name, start_cmd in names.items():
        with tempfile.TemporaryDirectory(prefix="wt-e2e-priv-") as context:
            Path(context, "e2b.Dockerfile").write_text("FROM debian:bookworm\n")
            args = [context, "--name", name, "--allow-raw-sockets", "--allow-io-uring"]
            if start_cmd:
                args += ["--start-cmd", start_cmd]
            built = warren.cli("template", "build", *args, timeout=900)
        assert built.returncode == 0, built.stdout + built.stderr
    try:
        for name in names:
            assert _probe(name) == GRANTED, name
        # The base template is untouched by the privileged builds beside it.
        assert _probe("base") == DEFAULT
    finally:
        for name in names:
            warren.cli("template", "delete", name, "--force")
