"""Checkpoints through the official E2B Python SDK against a real `warren up` (real CRIU, real processes):
fork x5 of a Python process holding a list, each fork mutated differently; pause -> resume keeps a
counter counting; snapshot create / list / create-from / delete.

Needs what the `warren` fixture needs plus a host that can checkpoint (`/health` says `checkpoint`);
otherwise every test here prints one `SKIP:` line and is skipped.
"""

import json
import sys
import time
import urllib.request

import pytest

# Bounds for waits (not assertions on speed).
WAIT_S = 120
LIST_PORT = 8123

# A Python process holding a list in memory, changed and read over loopback HTTP.
LIST_SERVER = f"""
import http.server, json, urllib.parse
items = [1, 2, 3]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/append":
            items.append(urllib.parse.parse_qs(url.query)["v"][0])
        body = json.dumps(items).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", {LIST_PORT}), Handler).serve_forever()
"""

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/wt-counter.tmp && mv /tmp/wt-counter.tmp /tmp/wt-counter; sleep 0.1; done"


def _skip(reason):
    # Past pytest's capture, so the run shows the reason on one line.
    sys.__stderr__.write(f"SKIP: {reason}\n")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def checkpointing(sdk_env):
    with urllib.request.urlopen(f"{sdk_env['E2B_API_URL']}/health", timeout=30) as answer:
        health = json.load(answer)
    if not health.get("checkpoint"):
        _skip("this host cannot take CRIU checkpoints (/health: checkpoint=false); fork/snapshot need them")
    return sdk_env


def _wait(what, probe):
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None:
                return value
        except Exception as error:  # noqa: BLE001 - report the last one if it never works
            last = error
        time.sleep(0.2)
    raise AssertionError(f"{what} within {WAIT_S}s; last error: {last!r}")


def _list(sandbox, path="/"):
    result = sandbox.commands.run(f"curl -sf 'http://127.0.0.1:{LIST_PORT}{path}'")
    return json.loads(result.stdout)


def _start_list_server(sandbox):
    sandbox.files.write("/home/user/wt_list_server.py", LIST_SERVER)
    sandbox.commands.run("python3 /home/user/wt_list_server.py", background=True)
    return _wait("the list server answers", lambda: _list(sandbox))


def _at_least(value, minimum):
    return value if value is not None and value >= minimum else None


def _counter(sandbox):
    text = sandbox.files.read("/tmp/wt-counter").strip()
    return int(text) if text else None


def test_fork_x5_each_fork_keeps_its_own_list(checkpointing):
    from e2b import Sandbox

    source = Sandbox.create(template="base", timeout=600, metadata={"suite": "wt-e2e-snapshots"})
    forks = []
    try:
        assert _start_list_server(source) == [1, 2, 3]
        assert _list(source, "/append?v=before") == [1, 2, 3, "before"]
        source_end = source.get_info().end_at

        started = time.monotonic()
        forks = source.fork(count=5, timeout=300)
        sys.__stderr__.write(f"\nfork x5 of a sandbox with a Python list server: {time.monotonic() - started:.2f} s\n")
        assert len(forks) == 5
        failed = [f for f in forks if isinstance(f, Exception)]
        assert not failed, failed
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 5 and source.sandbox_id not in ids

        # Each fork is its own machine: its own hostname, its own copy of the process's list.
        for n, fork in enumerate(forks):
            assert fork.commands.run("hostname").stdout.strip() == fork.sandbox_id
            assert _list(fork, f"/append?v=fork{n}") == [1, 2, 3, "before", f"fork{n}"]
        for n, fork in enumerate(forks):
            assert _list(fork) == [1, 2, 3, "before", f"fork{n}"]
        # The source kept running with its ID and end time, and its list is its own.
        assert _list(source, "/append?v=after") == [1, 2, 3, "before", "after"]
        assert source.get_info().end_at == source_end
    finally:
        for fork in forks:
            if not isinstance(fork, Exception):
                fork.kill()
        source.kill()


def test_pause_resume_keeps_a_counter_counting(checkpointing):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=600)
    try:
        sandbox.commands.run(COUNTER, background=True)
        _wait("the counter reaches 10", lambda: _at_least(_counter(sandbox), 10))
        before = _counter(sandbox)

        started = time.monotonic()
        sandbox.pause()
        paused_s = time.monotonic() - started
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"

        started = time.monotonic()
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
        resumed_s = time.monotonic() - started
        sys.__stderr__.write(f"\npause {paused_s:.2f} s, resume {resumed_s:.2f} s (SDK round trips)\n")
        assert resumed.sandbox_id == sandbox.sandbox_id
        after = _counter(resumed)
        # Continued from where it was (a restart would count from 1 again), and keeps counting.
        assert after >= before, (before, after)
        _wait("the counter moves on after resume", lambda: _at_least(_counter(resumed), after + 1))
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def _snapshot_ids(paginator):
    ids = []
    while paginator.has_next:
        ids.extend(s.snapshot_id for s in paginator.next_items())
    return ids


def test_snapshot_create_list_create_from_and_delete(checkpointing):
    from e2b import Sandbox

    source = Sandbox.create(template="base", timeout=600)
    child = None
    try:
        source.files.write("/home/user/wt-mark.txt", "snapshot mark")
        _start_list_server(source)
        _list(source, "/append?v=snap")

        info = source.create_snapshot(name="wt-e2e-snap")
        assert info.snapshot_id
        assert "wt-e2e-snap" in info.names
        assert info.snapshot_id in _snapshot_ids(source.list_snapshots())
        assert info.snapshot_id in _snapshot_ids(Sandbox.list_snapshots())
        # The source keeps running.
        assert _list(source, "/append?v=source-after") == [1, 2, 3, "snap", "source-after"]

        child = Sandbox.create(template=info.snapshot_id, timeout=300)
        assert child.sandbox_id != source.sandbox_id
        assert child.files.read("/home/user/wt-mark.txt") == "snapshot mark"
        assert _list(child) == [1, 2, 3, "snap"]

        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Sandbox.delete_snapshot(info.snapshot_id) is False
        assert info.snapshot_id not in _snapshot_ids(Sandbox.list_snapshots())
        # The child does not depend on the snapshot once it runs.
        assert _list(child, "/append?v=child") == [1, 2, 3, "snap", "child"]
    finally:
        if child is not None:
            child.kill()
        source.kill()
