"""Host-name egress rules through the official SDK against `warren up` (issue 15): a sandbox allowed
one name over a deny-everything reaches that name's server and nothing else, whatever address it
aims at; `update_network` flips the allowed name on the running sandbox; the rules survive
pause/resume and go with a fork.

The "internet" is a network namespace this module makes after the server started: two addresses on
a test-owned /29 of 198.18.0.0/15, a tiny HTTP server on each answering `served-by <address>`, and a
dnsmasq answering allowed.test -> A, other.test -> B (the server's `--egress-resolver`, see
conftest.py). No packet leaves the machine.
"""

import shutil
import subprocess
import sys
import time

import pytest
from e2b import ALL_TRAFFIC, Sandbox

from conftest import TEST_INTERNET

NS = "wt-e2e-inet"
LINK = "wte2einet"

SERVER = r"""
import http.server, sys
ip = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"served-by {ip}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((ip, 80), H).serve_forever()
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def internet(warren):
    if shutil.which("dnsmasq") is None:
        pytest.skip("dnsmasq is not installed (Debian package dnsmasq-base; scripts/setup installs it)")
    subprocess.run(["ip", "netns", "delete", NS], capture_output=True)
    a, b, local = TEST_INTERNET["a"], TEST_INTERNET["b"], TEST_INTERNET["local"]
    _ip("netns", "add", NS)
    children = []
    try:
        _ip("link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NS)
        _ip("addr", "add", f"{local}/29", "dev", LINK)
        _ip("link", "set", LINK, "up")
        for address in (a, b):
            _ip("-n", NS, "addr", "add", f"{address}/29", "dev", "eth0")
        _ip("-n", NS, "link", "set", "eth0", "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        for address in (a, b):
            children.append(
                subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", SERVER, address])
            )
        children.append(
            subprocess.Popen(
                ["ip", "netns", "exec", NS, "dnsmasq", "--keep-in-foreground", "--no-resolv",
                 "--no-hosts", "--conf-file=/dev/null", "--user=root", "--bind-interfaces",
                 "--port=53", "--pid-file=", f"--listen-address={a}",
                 f"--address=/allowed.test/{a}", f"--address=/other.test/{b}"],
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 30
        for address, port in ((a, 80), (b, 80), (a, 53)):
            while subprocess.run(
                ["ip", "netns", "exec", NS, sys.executable, "-c",
                 f"import socket; socket.create_connection(('{address}', {port}), 1)"],
                capture_output=True,
            ).returncode != 0:
                assert time.monotonic() < deadline, f"{address}:{port} never listened"
                time.sleep(0.1)
        yield {"a": a, "b": b}
    finally:
        for child in children:
            child.kill()
            child.wait()
        subprocess.run(["ip", "netns", "delete", NS], capture_output=True)


def _get(sandbox, address, name):
    result = sandbox.commands.run(
        f"curl -s -S -m 5 -H 'Host: {name}' http://{address}/ 2>&1 || true", timeout=30
    )
    return result.stdout.strip()


def test_allowed_names_follow_the_sandbox_through_update_pause_and_fork(sdk_env, internet):
    a, b = internet["a"], internet["b"]
    sandbox = Sandbox.create(
        network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]},
        timeout=300,
    )
    forks = []
    try:
        # Aimed at B, naming the allowed host: the proxy connects to what allowed.test resolves to.
        assert _get(sandbox, b, "allowed.test") == f"served-by {a}"
        assert "not allowed" in _get(sandbox, a, "other.test")

        sandbox.update_network({"allow_out": ["other.test"], "deny_out": [ALL_TRAFFIC]})
        assert _get(sandbox, a, "other.test") == f"served-by {b}"
        assert "not allowed" in _get(sandbox, b, "allowed.test")

        sandbox.pause()
        sandbox.connect()
        assert _get(sandbox, a, "other.test") == f"served-by {b}"
        assert "not allowed" in _get(sandbox, b, "allowed.test")

        forks = sandbox.fork(count=1)
        fork = forks[0]
        assert _get(fork, a, "other.test") == f"served-by {b}"
        assert "not allowed" in _get(fork, b, "allowed.test")
    finally:
        for fork in forks:
            fork.kill()
        sandbox.kill()
