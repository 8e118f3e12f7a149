"""Access through the official SDK against a real `warren up`: teams see only their own sandboxes,
private sandboxes need their traffic token on user ports, and a retried create with an
Idempotency-Key gets the first sandbox back."""

import time
import uuid

import pytest


def _admin(sdk_env):
    import httpx

    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"],
        headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
        timeout=60,
    )


def test_a_team_key_sees_and_touches_only_its_own_sandboxes(sdk_env):
    from e2b import Sandbox, SandboxQuery
    from e2b.exceptions import NotFoundException, SandboxException

    team = f"wt-blue-{uuid.uuid4().hex[:8]}"
    with _admin(sdk_env) as admin:
        assert admin.post("/teams", json={"name": team, "maxSandboxes": 1}).status_code == 201
        made = admin.post("/api-keys", json={"name": "blue", "teamID": team})
        assert made.status_code == 201, made.text
        blue_key = made.json()["key"]

    mine = Sandbox.create(template="base", timeout=120, metadata={"suite": "wt-access"})
    theirs = Sandbox.create(
        template="base", timeout=120, api_key=blue_key, metadata={"suite": "wt-access"}
    )
    try:
        assert theirs.commands.run("echo blue").stdout == "blue\n"
        # The default team's key cannot reach blue's sandbox by ID, nor list it; and vice versa.
        with pytest.raises((NotFoundException, SandboxException)):
            Sandbox.connect(theirs.sandbox_id)
        with pytest.raises((NotFoundException, SandboxException)):
            Sandbox.connect(mine.sandbox_id, api_key=blue_key)
        assert Sandbox.kill(theirs.sandbox_id) is False
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "wt-access"})).next_items()
        assert [s.sandbox_id for s in listed] == [mine.sandbox_id]
        blue_listed = Sandbox.list(
            query=SandboxQuery(metadata={"suite": "wt-access"}), api_key=blue_key
        ).next_items()
        assert [s.sandbox_id for s in blue_listed] == [theirs.sandbox_id]
        # Blue's quota is one sandbox.
        with pytest.raises(SandboxException) as exc_info:
            Sandbox.create(template="base", timeout=60, api_key=blue_key)
        assert "quota" in str(exc_info.value)
        # Blue's own key still drives its sandbox.
        assert theirs.is_running()
    finally:
        mine.kill()
        theirs.kill()


def test_a_private_sandbox_needs_its_traffic_token(sdk_env):
    import httpx
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=120, network={"allow_public_traffic": False})
    try:
        token = sandbox.traffic_access_token
        assert token, "a private sandbox gets a traffic access token"
        sandbox.commands.run(
            "cd /tmp && echo private-page > index.html && python3 -m http.server 8000",
            background=True,
        )
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
        proxy = sdk_env["E2B_SANDBOX_URL"]
        # Wait (bounded) for the server to listen; with the token every answer comes from it.
        deadline = time.monotonic() + 60
        while True:
            ok = httpx.get(
                f"{proxy}/index.html",
                headers={**headers, "e2b-traffic-access-token": token},
                timeout=30,
            )
            if ok.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert ok.status_code == 200 and ok.text == "private-page\n", ok.text
        refused = httpx.get(f"{proxy}/index.html", headers=headers, timeout=30)
        assert refused.status_code == 403, refused.text
        assert "e2b-traffic-access-token" in refused.text
        wrong = httpx.get(
            f"{proxy}/index.html",
            headers={**headers, "e2b-traffic-access-token": "not-it"},
            timeout=30,
        )
        assert wrong.status_code == 403
        # The SDK's own envd calls need no traffic token.
        assert sandbox.commands.run("echo envd").stdout == "envd\n"
    finally:
        sandbox.kill()


def test_a_retried_create_with_an_idempotency_key_returns_the_first_sandbox(sdk_env):
    from e2b import Sandbox

    key = f"wt-job-{uuid.uuid4().hex}"
    body = {"templateID": "base", "timeout": 120, "metadata": {"suite": "wt-idem"}}
    with _admin(sdk_env) as admin:
        first = admin.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
        retry = admin.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
        assert first.status_code == 201 and retry.status_code == 201, (first.text, retry.text)
        sandbox_id = first.json()["sandboxID"]
        assert retry.json()["sandboxID"] == sandbox_id
        changed = admin.post(
            "/v2/sandboxes", json={**body, "timeout": 60}, headers={"Idempotency-Key": key}
        )
        assert changed.status_code == 409, changed.text
    try:
        sandbox = Sandbox.connect(sandbox_id)
        assert sandbox.commands.run("hostname").stdout.strip() == sandbox_id
    finally:
        Sandbox.kill(sandbox_id)


HTTPS_ECHO = r"""
import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/tmp/cert.pem", "/tmp/key.pem")
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def test_masked_host_and_an_https_port_reach_the_sandbox_s_service(sdk_env, tmp_path):
    """`network.mask_request_host` is the Host the sandbox's services see (the port put in), and a
    port in `network.https_ports` is spoken to over TLS by the proxy (a self-signed certificate
    works), while the client speaks plain HTTP to the proxy."""
    import subprocess

    import httpx
    from e2b import Sandbox

    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=self-signed.test", "-keyout", str(tmp_path / "key.pem"), "-out",
         str(tmp_path / "cert.pem")],
        check=True, capture_output=True,
    )
    network = {"mask_request_host": "${PORT}-app.example.test", "https_ports": [8443]}
    sandbox = Sandbox.create(template="base", timeout=120, network=network)
    try:
        info = sandbox.get_info()
        assert info.network["mask_request_host"] == "${PORT}-app.example.test", info.network
        assert info.network["https_ports"] == [8443], info.network
        for name in ("cert.pem", "key.pem"):
            sandbox.files.write(f"/tmp/{name}", (tmp_path / name).read_text())
        sandbox.files.write("/tmp/https_echo.py", HTTPS_ECHO)
        sandbox.commands.run("python3 /tmp/https_echo.py", background=True)
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8443"}
        proxy = sdk_env["E2B_SANDBOX_URL"]
        deadline = time.monotonic() + 60
        while True:
            answer = httpx.get(f"{proxy}/", headers=headers, timeout=30)
            if answer.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (answer.status_code, answer.text) == (200, "host=8443-app.example.test"), answer.text
    finally:
        sandbox.kill()
