"""E2B_DOMAIN mode over HTTPS with the official SDK, and no E2B_SANDBOX_URL or E2B_API_URL.

A `warren up --tls --domain warren.test` of this test's own, in a network namespace of its own, listens
with its proxy on 198.18.7.1:443, one end of a veth into a second namespace of the test's own. The SDK runs inside that namespace
(`ip netns exec`), whose /etc/resolv.conf (bind-mounted from /etc/netns/NAME/) points at a dnsmasq the test
starts there, answering `*.warren.test` (api.warren.test included) with 198.18.7.1. The SDK trusts
Warren's local CA through SSL_CERT_FILE. No name is resolved by the host's resolver.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import _parse_exports, agent_binary, base_rootfs, free_port, missing_prerequisite, warren_binary

DOMAIN = "warren.test"
NS = f"wt-tls-{os.getpid()}"
# Warren runs in a network namespace of its own too (entered with nsenter, which keeps /sys and its
# cgroup mounts; `ip netns exec` would remount /sys), so its bridge and nft table never meet those of
# the session's `warren up` (conftest.py) running beside it.
SERVER_NS = f"wt-tlssrv-{os.getpid()}"
LINK = f"wtt{os.getpid() % 100000}"
HOST_IP = "198.18.7.1"
NS_IP = "198.18.7.2"

SDK_SCRIPT = r"""
import json, os
from e2b import Sandbox
assert "E2B_SANDBOX_URL" not in os.environ and "E2B_API_URL" not in os.environ
sandbox = Sandbox.create(timeout=120)
out = {"id": sandbox.sandbox_id, "host": sandbox.get_host(49983)}
result = sandbox.commands.run("echo hello-from-$((6*7))")
out["stdout"] = result.stdout
sandbox.files.write("/tmp/tls.txt", "written over https")
out["read"] = sandbox.files.read("/tmp/tls.txt")
out["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
sandbox.kill()
out["after_kill"] = [s.sandbox_id for s in Sandbox.list().next_items()]
print(json.dumps(out))
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def domain_net():
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    if shutil.which("dnsmasq") is None:
        pytest.skip("dnsmasq is not installed (Debian package dnsmasq-base; scripts/setup installs it)")
    netns_etc = Path("/etc/netns") / NS
    for ns in (NS, SERVER_NS):
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        _ip("netns", "add", ns)
    dnsmasq = None
    try:
        _ip("-n", SERVER_NS, "link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NS)
        _ip("-n", SERVER_NS, "addr", "add", f"{HOST_IP}/30", "dev", LINK)
        _ip("-n", SERVER_NS, "link", "set", LINK, "up")
        _ip("-n", SERVER_NS, "link", "set", "lo", "up")
        _ip("-n", NS, "addr", "add", f"{NS_IP}/30", "dev", "eth0")
        _ip("-n", NS, "link", "set", "eth0", "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        netns_etc.mkdir(parents=True, exist_ok=True)
        (netns_etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        dnsmasq = subprocess.Popen(
            ["ip", "netns", "exec", NS, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
             "--conf-file=/dev/null", "--user=root", "--bind-interfaces", "--listen-address=127.0.0.1",
             "--port=53", "--pid-file=", f"--address=/{DOMAIN}/{HOST_IP}"],
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        probe = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)\n"
                 "s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01' + bytes(6) + b'\\x03api\\x06warren\\x04test\\x00'"
                 " + b'\\x00\\x01\\x00\\x01', ('127.0.0.1', 53)); s.recv(512)")
        while subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", probe],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "dnsmasq never answered"
            time.sleep(0.1)
        yield
    finally:
        if dnsmasq is not None:
            dnsmasq.kill()
            dnsmasq.wait()
        for ns in (NS, SERVER_NS):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        shutil.rmtree(netns_etc, ignore_errors=True)


@pytest.fixture(scope="module")
def warren_tls(domain_net):
    state_dir = tempfile.mkdtemp(prefix="wt-e2e-tls-state-")
    # The state on a tmpfs of its own (in /tmp/privnet.sh's private mount namespace): the shared disk's
    # free space, less admission's 5% reserve, is often too small for a sandbox layer on this machine.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3g,mode=0700", "wt-e2e-tls", state_dir], check=True)
    log = tempfile.NamedTemporaryFile(prefix="wt-e2e-tls-", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    process = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{SERVER_NS}", str(warren_binary()), "up", "--tls", "--domain", DOMAIN,
         "--listen", f"127.0.0.1:{free_port()}", "--proxy-listen", f"{HOST_IP}:443",
         # Small layers: admission keeps a 5% reserve of the (shared) state disk free.
         "--sandbox-disk-mib", "256",
         # No built-in code-interpreter build at start: its build sandbox's 8 GiB sparse disk would count
         # as promised space on this small tmpfs and leave the test's sandbox none.
         "--no-code-interpreter", "--state-dir", state_dir, "--agent", str(agent_binary()), "--base-rootfs", str(base_rootfs())],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )
    lines = []
    seen = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if "NODE_EXTRA_CA_CERTS" in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert seen.wait(120), f"no export lines: {lines!r}\n{Path(log.name).read_text(errors='replace')}"
        exports = _parse_exports(lines)
        yield exports, "".join(lines), state_dir, log.name
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        subprocess.run(["umount", "--lazy", state_dir], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", state_dir], check=False)
        log.close()
        os.unlink(log.name)


def _in_namespace(env, script, timeout=180):
    return subprocess.run(
        ["ip", "netns", "exec", NS, sys.executable, "-c", script],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_sdk_in_domain_mode_over_https(warren_tls):
    exports, printed, state_dir, log_path = warren_tls
    assert exports["E2B_DOMAIN"] == DOMAIN, printed
    assert "E2B_SANDBOX_URL" not in exports and "E2B_API_URL" not in exports, printed
    ca = exports["SSL_CERT_FILE"]
    assert ca == str(Path(state_dir) / "tls" / "ca.crt"), printed
    assert oct(os.stat(Path(state_dir) / "tls" / "ca.key").st_mode & 0o777) == "0o600"

    base = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env = {**base, "E2B_DOMAIN": DOMAIN, "E2B_API_KEY": exports["E2B_API_KEY"], "SSL_CERT_FILE": ca}
    # The port listens once the server is up: wait for the API through the namespace's DNS and TLS.
    wait = ("import os, ssl, urllib.request, time\n"
            "ctx = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\n"
            "for _ in range(600):\n"
            "    try:\n"
            "        urllib.request.urlopen('https://api.warren.test/health', context=ctx, timeout=2); break\n"
            "    except urllib.error.HTTPError: break\n"
            "    except Exception: time.sleep(0.2)\n"
            "else: raise SystemExit('api.warren.test never answered')\n")
    ready = _in_namespace(env, wait)
    assert ready.returncode == 0, ready.stderr + Path(log_path).read_text(errors="replace")[-3000:]

    run = _in_namespace(env, SDK_SCRIPT)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["host"] == f"49983-{out['id']}.{DOMAIN}"
    assert out["stdout"].strip() == "hello-from-42"
    assert out["read"] == "written over https"
    assert out["id"] in out["listed"]
    assert out["id"] not in out["after_kill"]

    # Without Warren's CA the SDK does not trust the server.
    untrusted = {**env}
    untrusted.pop("SSL_CERT_FILE")
    refused = _in_namespace(untrusted, "from e2b import Sandbox\nSandbox.list().next_items()\n", timeout=120)
    assert refused.returncode != 0
    assert "certificate" in refused.stderr.lower() or "ssl" in refused.stderr.lower(), refused.stderr[-2000:]
