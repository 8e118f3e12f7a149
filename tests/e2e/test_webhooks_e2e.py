"""Webhooks as E2B has them (issue 18), against a real `warren up` and a receiver on loopback: a
team registers a URL with a secret, gets its sandboxes' created and killed events signed, a failing
endpoint gets each event again (three retries), and bad registrations are refused by name. Link-local
URLs are refused too; that is checked in `crates/server/src/api/webhooks.rs`'s unit tests, so no test
ever registers a URL the server could post to outside loopback."""

import base64
import hashlib
import http.server
import json
import threading
import time
import uuid

import httpx

from conftest import poll

DELIVERY_WAIT_S = 60


def _poll_quick(what, check, bound_s=DELIVERY_WAIT_S):
    return poll(what, check, bound_s, pause=0.3)


class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST; the first `fail` answers are 500."""

    def __init__(self, fail=0):
        self.requests = []
        self.fail = fail
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests.append((dict((k.lower(), v) for k, v in self.headers.items()), body))
                failing = receiver.fail > 0
                receiver.fail -= 1
                self.send_response(500 if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()

    def events(self, sandbox_id):
        return [
            (headers, json.loads(body))
            for headers, body in self.requests
            if json.loads(body).get("sandboxId") == sandbox_id
        ]



def _api(sdk_env, key=None):
    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": key or sdk_env["E2B_API_KEY"]}, timeout=60
    )


def test_signed_deliveries_retries_and_registration(sdk_env):
    from e2b import Sandbox

    good, flaky = Receiver(), Receiver(fail=2)
    secret = "wt-webhook-secret"
    try:
        with _api(sdk_env) as api:
            for bad, needle in [
                ({"url": good.url, "events": ["sandbox.lifecycle.exploded"]}, "exploded"),
                ({"url": good.url, "events": []}, "events"),
                ({"url": "ftp://127.0.0.1/x", "events": ["sandbox.lifecycle.created"]}, "http or https"),
                ({"url": good.url, "events": ["sandbox.lifecycle.created"], "color": "red"}, "color"),
            ]:
                refused = api.post("/events/webhooks", json=bad)
                if refused.status_code == 201:
                    api.delete(f"/events/webhooks/{refused.json()['id']}")
                assert refused.status_code == 400 and needle in refused.text, (bad, refused.text)
            made = api.post(
                "/events/webhooks",
                json={
                    "name": "wt-hook",
                    "url": good.url,
                    "events": ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
                    "signatureSecret": secret,
                },
            )
            assert made.status_code == 201, made.text
            hook = made.json()
            assert hook["enabled"] is True and hook["name"] == "wt-hook", hook
            assert "signatureSecret" not in hook and secret not in made.text
            flaky_hook = api.post(
                "/events/webhooks", json={"url": flaky.url, "events": ["sandbox.lifecycle.created"]}
            ).json()
            assert hook["id"] in [w["id"] for w in api.get("/events/webhooks").json()]

            sandbox = Sandbox.create(template="base", timeout=120, metadata={"suite": "wt-webhooks"})
            sandbox.kill()
            got = _poll_quick("created and killed", lambda: len(good.events(sandbox.sandbox_id)) >= 2 and good.events(sandbox.sandbox_id))
            assert [event["type"] for _, event in got] == [
                "sandbox.lifecycle.created",
                "sandbox.lifecycle.killed",
            ], got
            raw = [body for _, body in good.requests if json.loads(body)["sandboxId"] == sandbox.sandbox_id]
            for (headers, event), body in zip(got, raw):
                assert headers["e2b-webhook-id"] == hook["id"]
                assert headers["e2b-signature-version"] == "v1"
                digest = hashlib.sha256(secret.encode() + body).digest()
                assert headers["e2b-signature"] == base64.b64encode(digest).decode().rstrip("="), headers
                assert event["sandboxId"] == sandbox.sandbox_id and event["version"] == "v1"

            # The flaky endpoint answered 500 twice: the created event came three times, then stopped.
            tries = _poll_quick("the third try", lambda: len(flaky.events(sandbox.sandbox_id)) >= 3 and flaky.events(sandbox.sandbox_id))
            time.sleep(2)
            tries = flaky.events(sandbox.sandbox_id)
            assert len(tries) == 3, tries
            assert len({headers["e2b-delivery-id"] for headers, _ in tries}) == 3
            assert "e2b-signature" not in tries[0][0], "no secret, no signature"

            disabled = api.patch(f"/events/webhooks/{hook['id']}", json={"enabled": False})
            assert disabled.status_code == 200 and disabled.json()["enabled"] is False, disabled.text
            quiet = Sandbox.create(template="base", timeout=120, metadata={"suite": "wt-webhooks"})
            quiet.kill()
            _poll_quick("the flaky hook to see the next sandbox", lambda: flaky.events(quiet.sandbox_id))
            assert good.events(quiet.sandbox_id) == [], "a disabled webhook gets nothing"

            team = f"wt-hooks-{uuid.uuid4().hex[:6]}"
            assert api.post("/teams", json={"name": team}).status_code == 201
            other_key = api.post("/api-keys", json={"name": "hooks", "teamID": team}).json()["key"]
            with _api(sdk_env, other_key) as other:
                assert other.get(f"/events/webhooks/{hook['id']}").status_code == 404
                assert other.get("/events/webhooks").json() == []
                assert other.delete(f"/events/webhooks/{hook['id']}").status_code == 404
            for webhook in (hook, flaky_hook):
                assert api.delete(f"/events/webhooks/{webhook['id']}").status_code == 200
            assert api.get(f"/events/webhooks/{hook['id']}").status_code == 404
    finally:
        good.close()
        flaky.close()
