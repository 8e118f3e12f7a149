"""`warren up --node`: the server keeps the API, the store, the proxy and the lifecycle; a `warren
node` (another process with its own state directory) runs the sandboxes (issue 21, docs/cluster.md).
Runs in a private network namespace (scripts/private-netns), like the crash tests.

What is checked: the official SDK works end to end through a server whose sandboxes run on the node
(create, commands, files, pause to a checkpoint and resume with processes intact, kill); the
sandbox's supervisor belongs to the node's state directory, none to the server's; a server
restarted with SIGKILL adopts the node's sandboxes; a node restarted under a running sandbox serves
it on; the node refuses calls without its token and paths outside what it shares; a server whose node
is wrong refuses to start naming the problem.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import harness


class Node:
    """`warren node` on a state dir of its own, sharing the server's state dir and the rootfs."""

    def __init__(self, shared: list[Path], netns: str | None = None, address: str = "127.0.0.1", extra: list[str] | None = None):
        self.state_dir = Path(tempfile.mkdtemp(prefix="wt-node-state-"))
        self.port = harness.free_port()
        self.shared = shared
        self.netns = netns
        self.address = address
        self.extra = extra or []
        self.process: subprocess.Popen | None = None
        self.log_path = self.state_dir.with_name(self.state_dir.name + ".log")

    @property
    def url(self) -> str:
        scheme = "https" if "--tls" in self.extra else "http"
        return f"{scheme}://{self.address}:{self.port}"

    @property
    def token_file(self) -> Path:
        if "--token-file" in self.extra:
            return Path(self.extra[self.extra.index("--token-file") + 1])
        return self.state_dir / "node.token"

    def start(self) -> None:
        # In a network namespace of its own, with that namespace's sysfs over /sys/class and
        # /sys/devices (what scripts/private-netns does), and the host's cgroups left in place.
        command = (
            ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "-m", "--propagation", "private", "bash", "-c",
             'sys=$(mktemp -d); mount -t sysfs sysfs "$sys"; mount --bind "$sys/class" /sys/class; '
             'mount --bind "$sys/devices" /sys/devices; umount "$sys" && rmdir "$sys"; exec "$@"', "_"]
            if self.netns
            else []
        )
        command += [
            str(harness.warren_binary()),
            "node",
            "--listen",
            f"{self.address}:{self.port}",
            "--state-dir",
            str(self.state_dir),
            "--agent",
            str(harness.agent_binary()),
        ]
        for directory in self.shared:
            command += ["--shared-dir", str(directory)]
        command += self.extra
        log = open(self.log_path, "a")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        for line in self.process.stdout:
            if "listening on" in line:
                return
        raise RuntimeError(f"warren node exited with {self.process.wait()}: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
            self.process = None

    def call(self, body: dict, token: str | None = None):
        request = urllib.request.Request(
            self.url + "/v1/runtime",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {token if token is not None else self.token_file.read_text().strip()}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")


class RemoteWarren(harness.Warren):
    """`warren up --node`: the harness's server without a runtime of its own."""

    def __init__(self, node: Node, state_dir: Path):
        super().__init__(state_dir)
        self.node = node

    def _command(self) -> list[str]:
        command = super()._command()
        at = command.index("--agent")
        del command[at : at + 2]
        return command + ["--node", self.node.url, "--node-token-file", str(self.node.token_file)]


@pytest.fixture
def cluster():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    server_state = Path(tempfile.mkdtemp(prefix="wt-cluster-state-"))
    node = Node([server_state, harness.base_rootfs()])
    node.start()
    warren = RemoteWarren(node, server_state)
    try:
        yield node, warren
    finally:
        warren.cleanup()
        node.stop()
        subprocess.run(["umount", "-l", str(node.state_dir / "lxcfs")], check=False, stderr=subprocess.DEVNULL)
        shutil.rmtree(node.state_dir, ignore_errors=True)
        harness.drop_log(node.log_path)


def on(node: Node) -> set[str]:
    """The sandboxes `node` holds (its state directory's)."""
    return {p.name for p in (node.state_dir / "sandboxes").iterdir()}


def _supervisor_dirs() -> list[str]:
    return [cmd for _, cmd in harness.processes_mentioning("warren-supervisor") if "/sandboxes/" in cmd]


def test_the_sdk_works_through_a_server_whose_sandboxes_run_on_a_node(cluster):
    node, warren = cluster
    warren.start()
    Sandbox = harness.sdk()
    box = Sandbox.create(timeout=600)
    assert box.commands.run("hostname").stdout.strip() == box.sandbox_id
    box.files.write("/tmp/kept.txt", "written before the pause")
    box.commands.run("sleep 4242", background=True)

    # The sandbox is the node's: its directory is under the node's state dir, not the server's.
    assert (node.state_dir / "sandboxes" / box.sandbox_id).is_dir()
    assert not (warren.state_dir / "sandboxes" / box.sandbox_id).exists()
    owners = _supervisor_dirs()
    assert owners and all(str(node.state_dir) in cmd for cmd in owners), owners

    box.pause()
    row = next(r for r in warren.rows() if r["id"] == box.sandbox_id)
    assert row["state"] == "paused" and row["pause_kind"] == "checkpoint", row
    assert row["snapshot_dir"].startswith(str(warren.state_dir)), row
    resumed = Sandbox.connect(box.sandbox_id, timeout=600)
    assert resumed.files.read("/tmp/kept.txt") == "written before the pause"
    assert "sleep 4242" in resumed.commands.run("ps -eo args").stdout

    # A server killed outright adopts the node's sandboxes when it comes back.
    warren.sigkill()
    warren.start()
    again = Sandbox.connect(box.sandbox_id, timeout=600)
    assert "sleep 4242" in again.commands.run("ps -eo args").stdout

    # A node restarted under a running sandbox serves it on.
    node.stop()
    node.start()
    assert again.commands.run("echo still here").stdout.strip() == "still here"

    again.kill()
    harness.wait_until("the node has no sandbox left", lambda: not any((node.state_dir / "sandboxes").iterdir()), limit=30)


def test_the_node_refuses_strangers_and_paths_it_does_not_share(cluster):
    node, warren = cluster
    status, _ = node.call({"call": "list"}, token="not-the-token")
    assert status == 401
    status, answer = node.call({"call": "list"})
    assert status == 200 and answer == {"ok": []}, answer
    status, answer = node.call({"call": "commit_layer", "id": "nosuchbox", "dest": "/etc/warren-was-here"})
    assert status == 200 and answer["error"]["error"] == "invalid_spec", answer
    assert "/etc/warren-was-here" in answer["error"]["message"]
    assert not Path("/etc/warren-was-here").exists()
    status, answer = node.call({"call": "format_disk"})
    assert status == 400, answer


def test_a_server_with_a_wrong_node_refuses_to_start_naming_it(cluster):
    node, warren = cluster
    wrong_token = warren.state_dir.with_name(warren.state_dir.name + ".wrong-token")
    wrong_token.write_text("0" * 64)
    command = warren._command()
    command[command.index("--node-token-file") + 1] = str(wrong_token)
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "refused the token" in run.stderr, run.stderr[-2000:]

    unshared = Path(tempfile.mkdtemp(prefix="wt-cluster-unshared-"))
    command = warren._command()
    command[command.index("--state-dir") + 1] = str(unshared)
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert f"does not share {unshared}" in run.stderr, run.stderr[-2000:]
    shutil.rmtree(unshared, ignore_errors=True)
    wrong_token.unlink()


# --- a node on another network ------------------------------------------------------------------
# The test's namespace plays the server's machine; the node gets a network namespace of its own,
# joined to it by a veth on test-owned addresses (198.18.0.0/15). Nothing has a default route.
SERVER_ADDRESS = "198.18.10.1"
NODE_ADDRESS = "198.18.10.2"


def _sh(*command: str) -> None:
    subprocess.run(command, check=True)


def _node_namespace(name: str, lan: str, server_address: str, node_address: str) -> None:
    """Network namespace `name` joined to the test's by veth `lan` (/24, no default route)."""
    _sh("ip", "netns", "add", name)
    _sh("ip", "link", "add", lan, "type", "veth", "peer", "name", "uplink", "netns", name)
    _sh("ip", "addr", "add", f"{server_address}/24", "dev", lan)
    _sh("ip", "link", "set", lan, "up")
    _sh("ip", "-n", name, "addr", "add", f"{node_address}/24", "dev", "uplink")
    _sh("ip", "-n", name, "link", "set", "uplink", "up")
    _sh("ip", "-n", name, "link", "set", "lo", "up")


def _remove_namespace(name: str, lan: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False)
    subprocess.run(["ip", "link", "del", lan], check=False, stderr=subprocess.DEVNULL)


class RemoteCluster(RemoteWarren):
    """`warren up` with one `--node` per node."""

    def __init__(self, nodes: list[Node], state_dir: Path):
        super().__init__(nodes[0], state_dir)
        self.nodes = nodes

    def _command(self) -> list[str]:
        command = super()._command()
        for node in self.nodes[1:]:
            command += ["--node", node.url]
        return command


def start_nodes(nodes: list, made: list, flags: list[list[str]], shared_state: Path, *, name: str, lan: str,
                octet: int, subnet: int) -> None:
    """Starts one node per entry of `flags` (its extra flags): node i in network namespace
    `{name}-{i}`, joined to this one by veth `{lan}-{i}` on 198.18.{octet + i}.0/24, with sandbox
    subnet 10.{subnet + i}.0.1/16 and this namespace's address as its server's; all share the first
    node's token. Appends each node to `nodes` and each namespace to `made` as it goes, so a start
    that fails half-way leaves both for `stop_nodes`."""
    token = None
    for index, extra_flags in enumerate(flags):
        netns, link = f"{name}-{index}", f"{lan}-{index}"
        server_address, node_address = f"198.18.{octet + index}.1", f"198.18.{octet + index}.2"
        _node_namespace(netns, link, server_address, node_address)
        made.append((netns, link))
        extra = ["--subnet", f"10.{subnet + index}.0.1/16", "--server-address", server_address, *extra_flags]
        if token is not None:
            extra += ["--token-file", str(token)]
        node = Node([shared_state, harness.base_rootfs()], netns=netns, address=node_address, extra=extra)
        node.start()
        nodes.append(node)
        token = node.token_file


def stop_nodes(nodes: list, made: list) -> None:
    """Ends what runs on each node and stops it, then removes their state, logs and namespaces."""
    try:
        for node in nodes:
            try:
                _destroy_what_runs_on(node)
            finally:
                node.stop()
    finally:
        # After every node stopped: the later nodes read the first one's token file.
        for node in nodes:
            shutil.rmtree(node.state_dir, ignore_errors=True)
            harness.drop_log(node.log_path)
        for netns, link in made:
            _remove_namespace(netns, link)


@pytest.fixture
def remote_nodes(request):
    """`request.param` nodes (a count, or a list of each node's extra flags), each in a namespace of
    its own with its own subnet."""
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    param = getattr(request, "param", 1)
    flags = param if isinstance(param, list) else [[] for _ in range(param)]
    server_state = Path(tempfile.mkdtemp(prefix="wt-cluster-state-"))
    nodes, made = [], []
    try:
        # /run/netns is the host's: names of this run's own.
        start_nodes(nodes, made, flags, server_state, name=f"wt-node-{os.getpid()}", lan="wt-lan", octet=10, subnet=81)
        warren = RemoteCluster(nodes, server_state)
        try:
            yield nodes, warren
        finally:
            warren.cleanup()
    finally:
        stop_nodes(nodes, made)


def _destroy_what_runs_on(node: Node) -> None:
    """Whatever a test left on `node` (a sandbox the server recorded lost), through its own API."""
    if node.process is None:
        return
    status, answer = node.call({"call": "list"})
    if status == 200 and "ok" in answer:
        for sandbox in answer["ok"]:
            node.call({"call": "destroy", "id": sandbox["id"]})


@pytest.fixture
def remote_node(remote_nodes):
    nodes, warren = remote_nodes
    return nodes[0], warren


def test_a_node_on_another_network_serves_its_sandboxes_through_a_route(remote_node):
    node, warren = remote_node
    warren.start()
    # The server routed the node's sandbox subnet through the node.
    routes = subprocess.run(["ip", "route", "show", "10.81.0.0/16"], capture_output=True, text=True).stdout
    assert f"via {NODE_ADDRESS}" in routes, routes

    Sandbox = harness.sdk()
    box = Sandbox.create(timeout=600)
    assert box.commands.run("hostname -I").stdout.strip().startswith("10.81."), "the node's subnet"
    # A port of the sandbox, through the server's proxy (which connects over the route): the node's
    # firewall forwards new connections from its server's address, and only from there.
    box.commands.run("python3 -m http.server 8080 --directory /etc", background=True)
    request = urllib.request.Request(
        f"{warren.sandbox_url}/hostname",
        headers={"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "8080"},
    )
    answer = harness.wait_until(
        "the sandbox's port answers through the proxy",
        lambda: urllib.request.urlopen(request, timeout=5).read(),
        limit=30,
    )
    assert answer.decode().strip() == box.sandbox_id

    # The sandbox cannot open a connection to the server's machine: the node's own networks are
    # denied to sandboxes, as a host's are.
    reach = box.commands.run(
        f"python3 -c \"import socket; s=socket.socket(); s.settimeout(2); print(s.connect_ex(('{SERVER_ADDRESS}', {warren.api_port})))\"",
    )
    assert reach.stdout.strip() != "0", reach.stdout

    box.pause()
    resumed = Sandbox.connect(box.sandbox_id, timeout=600)
    assert resumed.commands.run("echo back").stdout.strip() == "back"
    resumed.kill()


@pytest.mark.parametrize("remote_nodes", [2], indirect=True)
def test_sandboxes_spread_over_two_nodes_and_a_paused_one_resumes_on_the_other(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    Sandbox = harness.sdk()

    boxes = [Sandbox.create(timeout=600) for _ in range(4)]
    assert len(on(node_a)) == 2 and len(on(node_b)) == 2, (on(node_a), on(node_b))
    for box in boxes:
        assert box.commands.run("echo up").stdout.strip() == "up"

    # A counter on node A, paused to a checkpoint in the shared state directory.
    moving = next(box for box in boxes if box.sandbox_id in on(node_a))
    moving.commands.run(harness.COUNTER, background=True)
    before = harness.wait_until("the counter counts", lambda: (lambda v: v if v >= 3 else None)(harness.read_counter(moving.sandbox_id)))
    moving.pause()
    assert moving.sandbox_id not in on(node_a)

    # Node A goes away; the resume goes to node B, processes and memory intact.
    node_a.stop()
    resumed = Sandbox.connect(moving.sandbox_id, timeout=600)
    assert moving.sandbox_id in on(node_b)
    assert resumed.commands.run("hostname -I").stdout.strip().startswith("10.82.")
    harness.wait_until(
        "the counter counts on from where it was",
        lambda: harness.read_counter(moving.sandbox_id) > before,
        limit=30,
    )
    # Creates keep working with node A down.
    extra = Sandbox.create(timeout=600)
    assert extra.sandbox_id in on(node_b)

    node_a.start()  # for the fixture's kills of node A's sandboxes


@pytest.mark.parametrize("remote_nodes", [2], indirect=True)
def test_a_lost_node_loses_its_sandboxes_and_is_fenced_when_it_returns(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    Sandbox = harness.sdk()

    first, second = Sandbox.create(timeout=600), Sandbox.create(timeout=600)
    doomed = next(box for box in (first, second) if box.sandbox_id in on(node_b))
    kept = first if doomed is second else second

    # Node B dies outright and its link goes: its sandbox keeps running there, unreachable.
    node_b.process.kill()
    node_b.process.wait()
    node_b.process = None
    _sh("ip", "link", "set", "wt-lan-1", "down")
    died = time.monotonic()

    def lost_row():
        row = next(r for r in warren.rows() if r["id"] == doomed.sandbox_id)
        return row if row["state"] == "failed" else None

    row = harness.wait_until("the dead node's sandbox is recorded lost", lost_row, limit=60)
    sys.__stderr__.write(f"\nnode down to sandbox lost: {time.monotonic() - died:.1f} s\n")
    assert "lost" in row["state_reason"] and node_b.url in row["state_reason"], row
    assert "down" in row["state_reason"], row
    # The other node's sandbox and new creates carry on.
    assert kept.commands.run("echo fine").stdout.strip() == "fine"
    fresh = Sandbox.create(timeout=600)
    assert fresh.sandbox_id in on(node_a)

    # Node B comes back still running the sandbox the server recorded lost: it is ended there.
    _sh("ip", "link", "set", "wt-lan-1", "up")
    assert doomed.sandbox_id in on(node_b)
    node_b.start()
    harness.wait_until(
        "the returning node no longer runs the lost sandbox",
        lambda: doomed.sandbox_id not in on(node_b),
        limit=60,
    )
    assert next(r for r in warren.rows() if r["id"] == doomed.sandbox_id)["state"] == "failed"


@pytest.mark.parametrize(
    "remote_nodes", [[["--max-total-memory-mib", "2048"], ["--max-total-memory-mib", "1024"]]], indirect=True
)
def test_sandboxes_fill_the_nodes_by_their_limits_and_429_comes_only_when_all_are_full(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    # `base` sandboxes hold 512 MiB each: node A has room for four, node B for two.
    made = []
    for _ in range(6):
        status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
        assert status == 201, body
        made.append(body["sandboxID"])
    assert (len(on(node_a)), len(on(node_b))) == (4, 2), (on(node_a), on(node_b))
    # Both full: the cluster answers 429 naming each node's limit.
    status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
    assert status == 429, body
    assert "every node is full" in body["message"] and "--max-total-memory-mib" in body["message"], body
    assert node_a.url.split("://")[1] in body["message"] and node_b.url.split("://")[1] in body["message"], body
    # One sandbox of B ends: the next create goes there at once.
    gone = next(iter(on(node_b)))
    assert warren.api("DELETE", f"/sandboxes/{gone}")[0] == 204
    status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
    assert status == 201, body
    assert body["sandboxID"] in on(node_b)


def _frozen(sandbox_id: str) -> bool:
    """Whether the sandbox's cgroup is frozen (v1 freezer or v2 cgroup.freeze)."""
    v1 = Path("/sys/fs/cgroup/freezer/warren") / sandbox_id / "freezer.state"
    if v1.exists():
        return v1.read_text().strip() == "FROZEN"
    v2 = Path("/sys/fs/cgroup/warren") / sandbox_id / "cgroup.freeze"
    return v2.read_text().strip() == "1"


@pytest.mark.parametrize("remote_nodes", [[["--fence-after", "2"], ["--fence-after", "2"]]], indirect=True)
def test_a_node_cut_off_freezes_its_sandboxes_before_it_is_declared_down(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    Sandbox = harness.sdk()
    boxes = [Sandbox.create(timeout=600) for _ in range(2)]
    cut = next(box for box in boxes if box.sandbox_id in on(node_b))
    kept = next(box for box in boxes if box is not cut)

    # Cut off for a few seconds (under the server's 7 s): the node freezes its sandbox on its own,
    # and once the server reaches it again, the server thaws it, as its row still says running.
    _sh("ip", "link", "set", "wt-lan-1", "down")
    try:
        harness.wait_until("the cut-off node freezes its sandbox", lambda: _frozen(cut.sandbox_id), limit=30)
        assert not _frozen(kept.sandbox_id), "the other node was not cut off"
        # A kill while its node cannot be reached: 503, and the sandbox's row is kept.
        status, body = warren.api("DELETE", f"/sandboxes/{cut.sandbox_id}")
        assert status == 503 and "cannot be reached" in body["message"], (status, body)
        assert next(r for r in warren.rows() if r["id"] == cut.sandbox_id)["state"] == "running"
    finally:
        _sh("ip", "link", "set", "wt-lan-1", "up")
    harness.wait_until("the server thaws it", lambda: not _frozen(cut.sandbox_id), limit=30)
    assert next(r for r in warren.rows() if r["id"] == cut.sandbox_id)["state"] == "running"
    assert cut.commands.run("echo thawed").stdout.strip() == "thawed"

    # Cut off for good: frozen before the server declares the node down and records the sandbox
    # lost, frozen while it stays cut off, and destroyed once the node is back.
    _sh("ip", "link", "set", "wt-lan-1", "down")
    try:
        frozen_first = []

        def lost():
            frozen_first.append(_frozen(cut.sandbox_id))
            row = next(r for r in warren.rows() if r["id"] == cut.sandbox_id)
            return row if row["state"] == "failed" else None

        row = harness.wait_until("the node is declared down", lost, limit=60)
        assert "lost" in row["state_reason"], row
        assert _frozen(cut.sandbox_id), "a sandbox recorded lost must not run on"
        assert True in frozen_first[:-1], "frozen before it was declared lost"
    finally:
        _sh("ip", "link", "set", "wt-lan-1", "up")
    harness.wait_until("the returning node's lost sandbox is destroyed", lambda: cut.sandbox_id not in on(node_b), limit=60)
    assert kept.commands.run("echo fine").stdout.strip() == "fine"


def _warren_cli(warren, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "E2B_API_URL": warren.api_url, "E2B_API_KEY": warren.api_key}
    return subprocess.run([str(harness.warren_binary()), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("remote_nodes", [2], indirect=True)
def test_a_sandbox_migrates_and_a_node_drains_with_processes_intact(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    Sandbox = harness.sdk()

    boxes = [Sandbox.create(timeout=600) for _ in range(4)]
    for box in boxes:
        box.commands.run(harness.COUNTER, background=True)
    values = {
        box.sandbox_id: harness.wait_until("the counter counts", lambda b=box: (lambda v: v if v >= 3 else None)(harness.read_counter(b.sandbox_id)))
        for box in boxes
    }

    # One sandbox, by the API: it moves to the other node and counts on.
    box = boxes[0]
    source = node_a if box.sandbox_id in on(node_a) else node_b
    target = node_b if source is node_a else node_a
    status, moved = warren.api("POST", f"/sandboxes/{box.sandbox_id}/migrate")
    assert status == 200, moved
    assert moved["from"] == source.url.split("://")[1] and moved["to"] == target.url.split("://")[1], moved
    assert moved["sandbox"]["sandboxID"] == box.sandbox_id
    assert box.sandbox_id in on(target) and box.sandbox_id not in on(source)
    harness.wait_until("the moved counter counts on", lambda: harness.read_counter(box.sandbox_id) > values[box.sandbox_id], limit=30)

    # A whole node, by the CLI: everything running on node A goes to node B, and nothing new
    # lands on A until it is let on again.
    on_a = on(node_a)
    assert on_a, "node A holds sandboxes before the drain"
    node_a_id = node_a.url.split("://")[1]
    drained = _warren_cli(warren, "nodes", "drain", node_a_id)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert on(node_a) == set() and on_a <= on(node_b), (on(node_a), on(node_b))
    for sandbox_id in on_a:
        assert f"{sandbox_id}: moved to {node_b.url.split('://')[1]}" in drained.stdout, drained.stdout
        harness.wait_until("a drained counter counts on", lambda s=sandbox_id: harness.read_counter(s) >= values[s], limit=30)
    listed = _warren_cli(warren, "nodes", "list")
    assert f"{node_a_id}  draining" in listed.stdout, listed.stdout
    assert Sandbox.create(timeout=600).sandbox_id in on(node_b)

    undrained = _warren_cli(warren, "nodes", "undrain", node_a_id)
    assert undrained.returncode == 0, undrained.stderr
    assert Sandbox.create(timeout=600).sandbox_id in on(node_a), "the least loaded node, taking sandboxes again"

    status, answer = warren.api("POST", "/nodes/198.18.99.9:1/drain")
    assert status == 404, answer


def test_a_server_without_nodes_refuses_migrate_and_drain_naming_why():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    warren = harness.Warren()
    try:
        warren.start()
        status, nodes = warren.api("GET", "/nodes")
        assert (status, nodes) == (200, [])
        status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
        assert status == 201, body
        status, answer = warren.api("POST", f"/sandboxes/{body['sandboxID']}/migrate")
        assert status == 409 and "no node" in answer["message"], answer
        status, answer = warren.api("POST", "/nodes/127.0.0.1:3100/drain")
        assert status == 501 and "own machine" in answer["message"], answer
    finally:
        warren.cleanup()


@pytest.mark.parametrize("remote_nodes", [2], indirect=True)
def test_a_template_built_on_nodes_starts_running_on_either(remote_nodes):
    (node_a, node_b), warren = remote_nodes
    warren.start()
    context = Path(tempfile.mkdtemp(prefix="wt-cluster-template-"))
    try:
        (context / "e2b.Dockerfile").write_text("FROM debian:bookworm\nRUN echo built-on-a-node > /greeting\n")
        built = _warren_cli(
            warren, "template", "build", str(context), "--name", "wt-cluster-tpl",
            "--start-cmd", "python3 -m http.server 8080 --directory /",
            "--ready-cmd", "python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/greeting')\"",
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    finally:
        shutil.rmtree(context, ignore_errors=True)
    # The template's layers and checkpoint are in the server's state directory, which both nodes
    # share: two sandboxes of it land on both nodes, each with the start command already serving.
    Sandbox = harness.sdk()
    first, second = Sandbox.create(template="wt-cluster-tpl", timeout=600), Sandbox.create(template="wt-cluster-tpl", timeout=600)
    holders = {box.sandbox_id: ("a" if box.sandbox_id in on(node_a) else "b") for box in (first, second)}
    assert sorted(holders.values()) == ["a", "b"], holders
    for box in (first, second):
        served = box.commands.run("curl -s http://127.0.0.1:8080/greeting").stdout.strip()
        assert served == "built-on-a-node", served
        box.kill()
    harness.wait_until("both nodes empty", lambda: not on(node_a) and not on(node_b), limit=30)

    # Locality: with one `base` sandbox on each node, a second sandbox of the template goes where
    # the first one runs (its layers warm there), though the other node holds fewer sandboxes.
    bases = [Sandbox.create(timeout=600) for _ in range(2)]
    assert {box.sandbox_id in on(node_a) for box in bases} == {True, False}, "one base on each node"
    third = Sandbox.create(template="wt-cluster-tpl", timeout=600)
    fourth = Sandbox.create(template="wt-cluster-tpl", timeout=600)
    where = lambda box: "a" if box.sandbox_id in on(node_a) else "b"  # noqa: E731
    assert where(third) == where(fourth), (where(third), where(fourth))
    for box in (*bases, third, fourth):
        box.kill()


def test_a_node_over_tls_serves_a_server_that_trusts_its_ca_and_no_other(tmp_path):
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    netns, lan = f"wt-node-{os.getpid()}-tls", "wt-lan-tls"
    server_state = Path(tempfile.mkdtemp(prefix="wt-cluster-state-"))
    _node_namespace(netns, lan, "198.18.20.1", "198.18.20.2")
    node = Node(
        [server_state, harness.base_rootfs()],
        netns=netns,
        address="198.18.20.2",
        extra=["--tls", "--subnet", "10.90.0.1/16", "--server-address", "198.18.20.1"],
    )
    warren = None
    try:
        node.start()
        ca = node.state_dir / "tls" / "ca.crt"
        assert node.url.startswith("https://") and ca.is_file()

        # Without the node's CA the server refuses to start, naming the node (on a state
        # directory of its own: the hello fails before the shared directories are looked at).
        refused = RemoteWarren(node, tmp_path / "refused")
        run = subprocess.run(refused._command(), capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and node.url in run.stderr, run.stderr[-2000:]
        assert "certificate" in run.stderr.lower(), run.stderr[-2000:]
        # Plain http to a TLS node is no node at all.
        plain = refused._command()
        plain[plain.index("--node") + 1] = node.url.replace("https://", "http://")
        run = subprocess.run(plain, capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and "not reachable" in run.stderr, run.stderr[-2000:]

        class TrustingWarren(RemoteWarren):
            def _command(self) -> list[str]:
                return super()._command() + ["--node-ca-file", str(ca)]

        warren = TrustingWarren(node, server_state)
        warren.start()
        box = harness.sdk().create(timeout=600)
        assert box.commands.run("hostname -I").stdout.strip().startswith("10.90.")
        box.kill()
        # The token still counts over TLS.
        request = urllib.request.Request(node.url + "/v1/hello", headers={"Authorization": "Bearer wrong"})
        context = __import__("ssl").create_default_context(cafile=str(ca))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10, context=context)
        assert refused.value.code == 401
    finally:
        if warren is not None:
            warren.cleanup()
        node.stop()
        shutil.rmtree(node.state_dir, ignore_errors=True)
        harness.drop_log(node.log_path)
        _remove_namespace(netns, lan)
