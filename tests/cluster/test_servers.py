"""Several servers sharing one PostgreSQL database and the same nodes (issue 21, docs/cluster.md).

Two `warren up --database-url ... --node ... --node ...` over one private PostgreSQL cluster and two
`warren node`s, each node in a network namespace of its own (as in test_node.py). Runs in a private
network namespace (scripts/private-netns), like the other cluster tests.

What is checked: a sandbox made through one server is used, listed, paused, resumed and killed
through the other, with its processes intact; the first server leads and the second joins without
touching the fleet; a timeout fires once, from the leader; the leader killed outright (while
creates are under way) passes the lead on, the other server settles what it left half done (no row
stays mid-transition, nothing runs on a node that no row names), enforces the timeouts from then
on, and the killed server started again joins without disturbing a running sandbox.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import harness
from test_node import Node, on, start_nodes, stop_nodes


class SharedServer(harness.Warren):
    """`warren up` on PostgreSQL with every node, its state directory shared with the others."""

    def __init__(self, state_dir: Path, nodes: list[Node], database: harness.Postgres, name: str):
        super().__init__(state_dir)
        self.nodes = nodes
        self.database = database
        # Logs of their own: both servers share the state directory.
        self.log_path = state_dir.with_name(f"{state_dir.name}.{name}.log")

    def _command(self) -> list[str]:
        command = super()._command()
        at = command.index("--agent")
        del command[at : at + 2]
        command += ["--database-url", self.database.url, "--node-token-file", str(self.nodes[0].token_file)]
        for node in self.nodes:
            command += ["--node", node.url]
        return command

    def rows(self) -> list[dict]:
        return self.database.rows("SELECT id, state, state_reason, pause_kind, snapshot_dir, owner FROM sandboxes")

    def sdk(self) -> dict:
        """The SDK's connection options for this server."""
        return {"api_url": self.api_url, "sandbox_url": self.sandbox_url, "api_key": self.api_key}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def fleet():
    """PostgreSQL, two nodes in namespaces of their own, two servers (not started)."""
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    if harness.pg_bin() is None:
        reason = "no PostgreSQL binaries (/usr/lib/postgresql/*/bin; install postgresql)"
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="wt-servers-state-"))
    nodes, made, servers = [], [], []
    with harness.private_postgres() as database:
        try:
            start_nodes(nodes, made, [[], []], state, name=f"wt-srv-node-{os.getpid()}", lan="wt-slan", octet=20,
                        subnet=91)
            servers = [SharedServer(state, nodes, database, name) for name in ("a", "b")]
            yield database, nodes, servers
        finally:
            for server in servers:
                server.stop()
            stop_nodes(nodes, made)
            subprocess.run(["rm", "-rf", "--one-file-system", str(state)], check=False)
            for server in servers:
                harness.drop_log(server.log_path)


def start_both(a: SharedServer, b: SharedServer) -> None:
    a.start()
    b.api_key = a.api_key  # the first server made the key; the database holds it for both
    b.start()


def leaders(servers) -> list[SharedServer]:
    return [s for s in servers if "this server now leads" in s.log()]


def servers_listed(server: SharedServer) -> list[dict]:
    """`warren --json servers list` through `server`."""
    env = {**os.environ, "E2B_API_URL": server.api_url, "E2B_API_KEY": server.api_key}
    run = subprocess.run([str(harness.warren_binary()), "--json", "servers", "list"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def on_nodes(nodes) -> set[str]:
    return set().union(*(on(node) for node in nodes))


def test_two_servers_share_the_sandboxes_of_one_database_and_their_nodes(fleet):
    database, nodes, (a, b) = fleet
    start_both(a, b)
    assert leaders((a, b)) == [a], "the first server leads"
    assert "joining the servers that share this store" in b.log()
    # The operator's view, through either server.
    listed = servers_listed(b)
    assert sorted(s["address"] for s in listed) == sorted(f"127.0.0.1:{s.api_port}" for s in (a, b)), listed
    assert [s["address"] for s in listed if s["leader"]] == [f"127.0.0.1:{a.api_port}"], listed
    assert [s["address"] for s in listed if s["this"]] == [f"127.0.0.1:{b.api_port}"], listed
    Sandbox = harness.sdk()

    box = Sandbox.create(timeout=600, **a.sdk())
    box.commands.run("sleep 4242", background=True)
    # Through the other server: the same sandbox, its commands and its ports.
    there = Sandbox.connect(box.sandbox_id, **b.sdk())
    assert there.commands.run("hostname").stdout.strip() == box.sandbox_id
    assert box.sandbox_id in [s.sandbox_id for s in Sandbox.list(**b.sdk()).next_items()]
    there.commands.run("python3 -m http.server 8080 --bind 0.0.0.0", background=True)
    harness.wait_until(
        "the sandbox's port answers through the second server's proxy",
        lambda: "Directory listing" in there.commands.run(
            "curl -s http://127.0.0.1:8080/ || true").stdout,
    )
    status, page = _get(f"{b.sandbox_url}/", {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "8080"})
    assert status == 200 and "Directory listing" in page, (status, page[:300])
    status, page = _get(f"{a.sandbox_url}/", {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "8080"})
    assert status == 200 and "Directory listing" in page, (status, page[:300])

    # Paused through B, resumed through A (on whichever node), processes intact; each row change
    # records the server that made it.
    there.pause()
    row = next(r for r in a.rows() if r["id"] == box.sandbox_id)
    assert row["state"] == "paused", row
    back = Sandbox.connect(box.sandbox_id, timeout=600, **a.sdk())
    assert "sleep 4242" in back.commands.run("ps -eo args").stdout
    status, page = _get(f"{b.sandbox_url}/", {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "8080"})
    assert status == 200 and "Directory listing" in page, "the second server routes to the resumed sandbox"

    # Paused through one server, woken by traffic through the other's proxy (auto-resume), its
    # server process intact.
    status, body = a.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600, "autoPause": True,
                                                 "autoResume": {"enabled": True}})
    assert status == 201, body
    sleepy = Sandbox.connect(body["sandboxID"], **a.sdk())
    sleepy.commands.run("cd / && python3 -m http.server 8081 --bind 0.0.0.0", background=True)
    harness.wait_until(
        "the sleepy sandbox serves",
        lambda: _get(f"{a.sandbox_url}/", {"E2b-Sandbox-Id": sleepy.sandbox_id, "E2b-Sandbox-Port": "8081"})[0] == 200,
    )
    assert a.api("POST", f"/sandboxes/{sleepy.sandbox_id}/pause")[0] == 204
    status, page = _get(f"{b.sandbox_url}/", {"E2b-Sandbox-Id": sleepy.sandbox_id, "E2b-Sandbox-Port": "8081"})
    assert status == 200 and "Directory listing" in page, (status, page[:300])
    assert next(r for r in b.rows() if r["id"] == sleepy.sandbox_id)["state"] == "running"
    sleepy.kill()

    # A timeout fires once, from the leader: one `killed` event.
    short = Sandbox.create(timeout=3, **b.sdk())
    harness.wait_until(
        "the short sandbox's timeout ends it",
        lambda: next(r for r in a.rows() if r["id"] == short.sandbox_id)["state"] == "killed",
        limit=60,
    )
    events = database.sql(
        f"SELECT count(*) FROM sandbox_events WHERE sandbox_id = '{short.sandbox_id}' AND to_state = 'killed'"
    )
    assert events == "1", events

    Sandbox.kill(box.sandbox_id, **b.sdk())
    status, _ = a.api("GET", f"/sandboxes/{box.sandbox_id}")
    assert status == 404
    harness.wait_until("the nodes run nothing", lambda: not on_nodes(nodes), limit=60)

    # A drain through one server holds for the other: the node keeps the mark.
    drained = nodes[0].url.split("://")[1]
    status, report = a.api("POST", f"/nodes/{drained}/drain")
    assert status == 200, report
    # The other server reads it in the node's next hello (each second).
    harness.wait_until(
        "the second server sees the node drained",
        lambda: {n["nodeID"]: n["draining"] for n in b.api("GET", "/nodes")[1]}[drained] is True,
        limit=10,
    )
    placed = [Sandbox.create(timeout=600, **b.sdk()) for _ in range(2)]
    assert all(p.sandbox_id in on(nodes[1]) for p in placed), [on(n) for n in nodes]
    assert b.api("DELETE", f"/nodes/{drained}/drain")[0] == 204
    harness.wait_until(
        "the first server sees the node undrained",
        lambda: {n["nodeID"]: n["draining"] for n in a.api("GET", "/nodes")[1]}[drained] is False,
        limit=10,
    )
    for p in placed:
        p.kill()


def _get(url: str, headers: dict) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_the_leader_killed_mid_create_hands_over_and_nothing_is_left_half_done(fleet):
    database, nodes, (a, b) = fleet
    start_both(a, b)
    Sandbox = harness.sdk()
    kept = Sandbox.create(timeout=600, **b.sdk())
    kept.commands.run("sleep 4343", background=True)
    expiring = Sandbox.create(timeout=20, **a.sdk())

    # Creates under way through A when it is killed outright.
    answers = []

    def create():
        try:
            answers.append(a.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600}, timeout=30))
        except OSError as error:  # the server died before it answered
            answers.append((type(error).__name__, None))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.03)
    a.sigkill()
    for thread in threads:
        thread.join()
    killed_at = time.monotonic()

    # B leads within a beat or two of A's connection ending; A drops out of the list with its lease.
    harness.wait_until("the second server leads", lambda: leaders((b,)) == [b], limit=30)
    harness.wait_until(
        "the list shows the second server alone, leading",
        lambda: [(s["address"], s["leader"]) for s in servers_listed(b)] == [(f"127.0.0.1:{b.api_port}", True)],
        limit=30,
    )
    # What A left mid-create is settled once A's lease runs out; nothing runs without a row.
    def settled():
        rows = b.rows()
        if any(r["state"] in ("creating", "pausing", "resuming") for r in rows):
            return None
        live = {r["id"] for r in rows if r["state"] in ("running", "paused")}
        running = {r["id"] for r in rows if r["state"] == "running"}
        return rows if on_nodes(nodes) == running and running <= live else None

    rows = harness.wait_until("what the dead server left is settled", settled, limit=90)
    sys.__stderr__.write(
        f"\nleader killed to settled: {time.monotonic() - killed_at:.1f} s; "
        f"creates answered: {[status for status, _ in answers]}; "
        f"rows: {sorted((r['state'], r['state_reason'] or '') for r in rows)}\n"
    )
    for row in rows:
        if row["state"] == "failed":
            assert row["state_reason"].startswith("lost:"), row
    if any(r["state"] == "failed" for r in rows):
        assert "took over what dead servers left" in b.log()

    # The timeout of a sandbox A made is enforced by B now.
    harness.wait_until(
        "the expiring sandbox ends at its timeout",
        lambda: next(r for r in b.rows() if r["id"] == expiring.sandbox_id)["state"] == "killed",
        limit=60,
    )
    assert "sleep 4343" in Sandbox.connect(kept.sandbox_id, **b.sdk()).commands.run("ps -eo args").stdout

    # A started again joins B and leaves the fleet as it is.
    a.start()
    assert "joining the servers that share this store" in a.log().split("==== start 2")[-1]
    assert "sleep 4343" in Sandbox.connect(kept.sandbox_id, **a.sdk()).commands.run("ps -eo args").stdout
    Sandbox.kill(kept.sandbox_id, **a.sdk())
    for row in b.rows():
        if row["state"] == "running":
            b.api("DELETE", f"/sandboxes/{row['id']}")
    harness.wait_until("the nodes run nothing", lambda: not on_nodes(nodes), limit=60)


def test_postgresql_restarted_under_load_loses_nothing(fleet):
    database, nodes, (a, b) = fleet
    start_both(a, b)
    Sandbox = harness.sdk()
    kept = Sandbox.create(timeout=600, **a.sdk())
    kept.commands.run("sleep 4444", background=True)

    # Creates and kills through both servers, all through the database's restart.
    stop = threading.Event()
    seen: list[tuple[str, object]] = []

    def load(server: SharedServer):
        while not stop.is_set():
            status, body = server.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600}, timeout=60)
            seen.append(("create", status))
            if status == 201:
                status, _ = server.api("DELETE", f"/sandboxes/{body['sandboxID']}", timeout=60)
                seen.append(("kill", status))
            elif status == 503:
                time.sleep(0.2)

    threads = [threading.Thread(target=load, args=(server,)) for server in (a, b)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        database.stop()
        time.sleep(3)
        database.start()
        time.sleep(4)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    sys.__stderr__.write(f"\nthrough the restart: {sorted(set(seen))}, {len(seen)} answers\n")
    # Every answer is a success, or 503 while the database was away: never a 500.
    assert {status for _, status in seen} <= {201, 204, 503}, seen
    assert ("create", 201) in seen and ("create", 503) in seen, seen

    # Afterwards: one leader again, creates through both, the kept sandbox's processes intact.
    harness.wait_until(
        "one server leads again",
        lambda: sum(s["leader"] for s in servers_listed(a)) == 1,
        limit=30,
    )
    for server in (a, b):
        box = Sandbox.create(timeout=600, **server.sdk())
        assert box.commands.run("echo made").stdout.strip() == "made"
        box.kill()
        assert "sleep 4444" in Sandbox.connect(kept.sandbox_id, **server.sdk()).commands.run("ps -eo args").stdout

    # Nothing left half done: no row mid-transition, nothing on the nodes without a running row.
    def settled():
        rows = a.rows()
        if any(r["state"] in ("creating", "pausing", "resuming") for r in rows):
            return None
        running = {r["id"] for r in rows if r["state"] == "running"}
        return rows if on_nodes(nodes) == running else None

    rows = harness.wait_until("every row and node agree", settled, limit=90)
    assert kept.sandbox_id in {r["id"] for r in rows if r["state"] == "running"}
    outcome: dict = {}
    for row in rows:
        key = (row["state"], row["state_reason"] or "")
        outcome[key] = outcome.get(key, 0) + 1
    sys.__stderr__.write(f"rows afterwards: {sorted(outcome.items())}\n")
    kept.kill()
