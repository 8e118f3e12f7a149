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
import http.server, ssl, sys
ip, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization")
        peer = f" from {self.client_address[0]}" if self.path.startswith("/peer") else ""
        body = (f"served-by {ip}" + (f" auth={auth}" if auth else "") + peer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((ip, port), H)
if len(sys.argv) > 3:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[3], sys.argv[4])
    server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def internet(warren):
    if shutil.which("dnsmasq") is None:
        pytest.skip("dnsmasq is not installed (Debian package dnsmasq-base; scripts/setup installs it)")
    subprocess.run(["ip", "netns", "delete", NS], capture_output=True)
    a, b, c, local = TEST_INTERNET["a"], TEST_INTERNET["b"], TEST_INTERNET["c"], TEST_INTERNET["local"]
    pki = TEST_INTERNET["pki"]
    _ip("netns", "add", NS)
    children = []
    try:
        _ip("link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NS)
        _ip("addr", "add", f"{local}/29", "dev", LINK)
        _ip("link", "set", LINK, "up")
        for address in (a, b, c):
            _ip("-n", NS, "addr", "add", f"{address}/29", "dev", "eth0")
        _ip("-n", NS, "link", "set", "eth0", "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        servers = [[a, "80"], [b, "80"], [c, "80"], [c, "443", pki["cert"], pki["key"]]]
        for args in servers:
            children.append(
                subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", SERVER, *args])
            )
        children.append(
            subprocess.Popen(
                ["ip", "netns", "exec", NS, "dnsmasq", "--keep-in-foreground", "--no-resolv",
                 "--no-hosts", "--conf-file=/dev/null", "--user=root", "--bind-interfaces",
                 "--port=53", "--pid-file=", f"--listen-address={a}",
                 f"--address=/allowed.test/{a}", f"--address=/other.test/{b}",
                 f"--address=/api.allowed.test/{c}"],
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 30
        for address, port in ((a, 80), (b, 80), (c, 80), (c, 443), (a, 53)):
            while subprocess.run(
                ["ip", "netns", "exec", NS, sys.executable, "-c",
                 f"import socket; socket.create_connection(('{address}', {port}), 1)"],
                capture_output=True,
            ).returncode != 0:
                assert time.monotonic() < deadline, f"{address}:{port} never listened"
                time.sleep(0.1)
        yield {"a": a, "b": b, "c": c, "local": local}
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


def test_header_rules_add_a_secret_on_the_host_that_never_enters_the_sandbox(sdk_env, internet):
    b, c = internet["b"], internet["c"]
    secret = "Bearer e2e-s3cret-on-the-host"
    sandbox = Sandbox.create(
        network={
            "allow_out": ["api.allowed.test"],
            "deny_out": [ALL_TRAFFIC],
            "rules": {"api.allowed.test": [{"transform": {"headers": {"Authorization": secret}}}]},
        },
        timeout=300,
    )
    try:
        # The guest's own curl, with the system trust store the agent added the host's egress CA to
        # (no --cacert, no -k): aimed at B, the proxy goes where api.allowed.test resolves and sets
        # the header, replacing the sandbox's own.
        out = sandbox.commands.run(
            f"curl -s -S -m 5 --resolve api.allowed.test:443:{b} -H 'Authorization: mine' "
            "https://api.allowed.test/ 2>&1 || true",
            timeout=30,
        ).stdout.strip()
        assert out == f"served-by {c} auth={secret}", out
        env = sandbox.commands.run("env").stdout
        assert "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt" in env, env
        found = sandbox.commands.run(
            "grep -rsl e2e-s3cret /etc /tmp /root /home /proc/1/environ /proc/self/environ || true",
            user="root",
        ).stdout.strip()
        assert found == "", f"the secret is inside the sandbox: {found}"
        # GET shows which header is set, never its value.
        info = sandbox.get_info()
        assert "e2e-s3cret" not in repr(info)
    finally:
        sandbox.kill()


def test_egress_proxy_tunnels_the_sandbox_tcp_through_its_socks5_proxy(sdk_env, internet):
    """`network.egress_proxy`: the sandbox's TCP leaves through a SOCKS5 proxy of its own (Debian's
    microsocks in the test's internet, with a login), which the web server sees as the client; GET
    shows the proxy without its password; an update without it goes direct again; a proxy address in
    a range sandboxes may never reach is refused at create."""
    from e2b import SandboxException

    if shutil.which("microsocks") is None:
        print("SKIP: microsocks is not installed (Debian package; scripts/setup installs it)")
        return
    a, b, local = internet["a"], internet["b"], internet["local"]
    socks = subprocess.Popen(
        ["ip", "netns", "exec", NS, "microsocks", "-i", b, "-p", "1080", "-b", b,
         "-u", "agent", "-P", "e2e-socks-pass"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    sandbox = None
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(
            ["ip", "netns", "exec", NS, sys.executable, "-c",
             f"import socket; socket.create_connection(('{b}', 1080), 1)"],
            capture_output=True,
        ).returncode != 0:
            assert time.monotonic() < deadline, "microsocks never listened"
            time.sleep(0.1)
        proxy = {"address": f"{b}:1080", "username": "agent", "password": "e2e-socks-pass"}
        sandbox = Sandbox.create(network={"egress_proxy": proxy}, timeout=120)
        assert _get(sandbox, f"{a}/peer", "anything") == f"served-by {a} from {b}"
        info = sandbox.get_info()
        assert info.network["egress_proxy"] == {"address": f"{b}:1080", "username": "agent"}, info
        assert "e2e-socks-pass" not in repr(info)

        sandbox.update_network({})
        assert _get(sandbox, f"{a}/peer", "anything") == f"served-by {a} from {local}"

        with pytest.raises(SandboxException, match="400: network.egressProxy: .* may never reach"):
            Sandbox.create(network={"egress_proxy": {"address": "10.77.255.250:1080"}}, timeout=60)
    finally:
        socks.kill()
        socks.wait()
        if sandbox is not None:
            sandbox.kill()
