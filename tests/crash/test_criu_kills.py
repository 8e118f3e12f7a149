"""CRIU itself killed (SIGKILL) in the middle of a dump and of a restore, by something other than the
server's death (issue 16). A sandbox holding 200 MiB keeps the dump and the restore long enough to hit.

- mid-dump: the pause falls back to a freeze (`paused`, in memory); the partial checkpoint is gone; the
  resume gives back the same processes;
- mid-restore: the resume fails with a 500 and an error id; the sandbox stays `paused` with its
  checkpoint whole and nothing of the half-restored sandbox left; the next resume works, processes
  and memory intact;
- the lazy-pages daemon mid-transfer (a lazy resume's memory still arriving): the tree is ended, the
  sandbox recorded failed (or left paused) with its checkpoint kept, no daemon or page server left.

Runs in a network namespace of its own (scripts/private-netns), like the other crash tests.
"""

import os
import signal
import sys
import threading
import time

import pytest

import harness

HOLD_MEMORY = "python3 -c 'import time; b = bytearray(200 << 20); time.sleep(10 ** 6)'"
ATTEMPTS = 4


@pytest.fixture
def warren():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    server = harness.Warren()
    server.start()
    status, health = server.api("GET", "/health")
    if not (isinstance(health, dict) and health.get("checkpoint")):
        server.cleanup()
        sys.__stderr__.write("SKIP: this host cannot take CRIU checkpoints\n")
        pytest.skip("no CRIU checkpoints on this host")
    yield server
    server.cleanup()


def _criu(action):
    for pid, cmd in harness.processes_mentioning("criu"):
        words = cmd.split()
        if words and words[0].endswith("criu") and action in words[1:3]:
            return pid
    return None


def _kill_criu_during(action, call):
    """Runs `call` in a thread and SIGKILLs the first `criu <action>` it starts; returns (answer, killed)."""
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault("value", call()))
    thread.start()
    killed = None
    deadline = time.monotonic() + harness.OP_WAIT_S
    while thread.is_alive() and killed is None and time.monotonic() < deadline:
        pid = _criu(action)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
                killed = pid
            except ProcessLookupError:
                pass
    thread.join(timeout=harness.OP_WAIT_S)
    return answer.get("value"), killed


def _sandbox_holding_memory(warren):
    sandbox_id, value = harness.start_counter(warren)
    harness.sdk().connect(sandbox_id).commands.run(HOLD_MEMORY, background=True)
    return sandbox_id, value


def _row(warren, sandbox_id):
    return next(row for row in warren.rows() if row["id"] == sandbox_id)


def _no_checkpoint_debris(warren):
    snapshots = warren.state_dir / "snapshots"
    if snapshots.is_dir():
        for entry in snapshots.iterdir():
            assert ".tmp-" not in entry.name, f"half-written checkpoint {entry}"
            assert (entry / "manifest.json").is_file(), f"checkpoint without a manifest: {entry}"


def test_criu_killed_mid_dump_leaves_the_sandbox_paused_in_memory(warren):
    landed = 0
    for _ in range(ATTEMPTS):
        sandbox_id, before = _sandbox_holding_memory(warren)
        answer, killed = _kill_criu_during("dump", lambda: warren.api("POST", f"/sandboxes/{sandbox_id}/pause"))
        row = _row(warren, sandbox_id)
        # Either the kill cut the dump short (a freeze instead) or it came too late to matter (a
        # whole checkpoint); both are a pause that resumes.
        assert answer[0] == 204, answer
        assert row["state"] == "paused" and row["pause_kind"] in ("freeze", "checkpoint"), row
        if killed is not None and row["pause_kind"] == "freeze":
            landed += 1
        # Whatever CRIU forked before it was killed (namespace dumpers, sysctl workers) ends with it.
        harness.wait_until(
            "no criu dump is left once the pause answered",
            lambda: not [p for p in harness.processes_mentioning(" dump --tree ") if "criu" in p[1]],
            limit=5,
        )
        _no_checkpoint_debris(warren)
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        assert status == 201, (status, body)
        assert harness.read_counter(sandbox_id) >= before
        warren.api("DELETE", f"/sandboxes/{sandbox_id}")
        if landed:
            break
    assert landed, f"no criu dump was cut short in {ATTEMPTS} pauses"
    assert harness.host_links() == [], harness.host_links()


def test_criu_killed_mid_restore_keeps_the_checkpoint_for_the_next_resume(warren):
    landed = 0
    for _ in range(ATTEMPTS):
        sandbox_id, before = _sandbox_holding_memory(warren)
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
        assert status == 204, (status, body)
        assert _row(warren, sandbox_id)["pause_kind"] == "checkpoint"
        answer, killed = _kill_criu_during(
            "restore", lambda: warren.api("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        if killed is not None and answer[0] != 201:
            landed += 1
            assert answer[0] == 500 and "error id" in answer[1]["message"], answer
            row = _row(warren, sandbox_id)
            assert (row["state"], row["pause_kind"]) == ("paused", "checkpoint"), row
            assert "restore failed" in row["state_reason"], row
            assert sandbox_id not in harness.live_runtime_ids(warren)
            assert harness.host_links() == [], harness.host_links()
            _no_checkpoint_debris(warren)
            status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 600})
            assert status == 201, (status, body)
        assert harness.read_counter(sandbox_id) >= before
        warren.api("DELETE", f"/sandboxes/{sandbox_id}")
        if landed:
            break
    assert landed, f"no criu restore was caught in {ATTEMPTS} resumes"


HOLD_TOUCHED_MEMORY = (
    "python3 -c 'import time; b = bytearray(b\"x\") * (400 << 20); open(\"/tmp/held\", \"w\").close(); "
    "time.sleep(10 ** 6)'"
)


def test_lazy_pages_daemon_killed_mid_transfer_ends_the_sandbox_and_keeps_its_checkpoint(warren):
    """The daemon that brings a lazy resume's memory in (`criu lazy-pages`) killed while pages are still
    arriving: the sandbox must not run on without them. Its tree is ended, it is recorded `failed`
    (or, when the tree died before the resume answered, stays `paused`) with its checkpoint kept, and
    no daemon, page server or host link is left."""
    landed = 0
    for _ in range(ATTEMPTS):
        sandbox_id, _ = harness.start_counter(warren)
        sbx = harness.sdk().connect(sandbox_id)
        sbx.commands.run(HOLD_TOUCHED_MEMORY, background=True)
        harness.wait_until("the memory held", lambda: sbx.files.exists("/tmp/held"))
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
        assert status == 204, (status, body)
        answer, killed = _kill_criu_during(
            "lazy-pages", lambda: warren.api("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        if killed is None:
            warren.api("DELETE", f"/sandboxes/{sandbox_id}")
            continue
        landed += 1
        sys.__stderr__.write(f"criu lazy-pages killed; the resume answered {answer[0]}\n")
        if answer[0] == 201:
            row = harness.wait_until(
                "the sandbox recorded failed",
                lambda: (r := _row(warren, sandbox_id))["state"] == "failed" and r,
                limit=120,
            )
            assert "lazy restore" in row["state_reason"], row
            kept = warren.state_dir / "snapshots" / sandbox_id
            assert row["snapshot_dir"] == str(kept), row
        else:
            row = _row(warren, sandbox_id)
            assert (row["state"], row["pause_kind"]) == ("paused", "checkpoint"), (answer, row)
            kept = warren.state_dir / "snapshots" / sandbox_id
        assert (kept / "manifest.json").is_file(), f"checkpoint gone: {kept}"
        assert sandbox_id not in harness.live_runtime_ids(warren)
        harness.wait_until(
            "no lazy-pages daemon or page server left",
            lambda: not harness.processes_mentioning("lazy-pages")
            and not harness.processes_mentioning("serve-pages"),
        )
        warren.api("DELETE", f"/sandboxes/{sandbox_id}")
        assert harness.host_links() == [], harness.host_links()
        break
    assert landed, f"no criu lazy-pages was caught in {ATTEMPTS} resumes"
