"""SIGKILL of the pieces under a live server (issue 16): a sandbox's supervisor and a sandbox's agent
(its init). Each ends in a defined state with an event, never a hang, and nothing is left behind.

- supervisor: the sandbox runs on, the server's next look at the host gives it a new supervisor
  (the dead man's switch holds again), and stopping everything leaves no process, mount or link;
- agent: the sandbox is gone; the server marks it failed ("lost", with the reason in its events),
  reclaims its link, mounts and cgroups, and new sandboxes start as before.

Runs in a network namespace of its own (scripts/private-netns), like the other crash tests.
"""

import os
import signal
import sys

import pytest

import harness


@pytest.fixture
def warren():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    server = harness.Warren()
    server.start()
    yield server
    server.cleanup()


def _state(warren, sandbox_id):
    rows = {row["id"]: row for row in warren.rows()}
    return rows[sandbox_id]


def _supervisors(sandbox_id):
    return [pid for pid, cmd in harness.processes_mentioning(sandbox_id) if "warren-supervisor" in cmd]


def _check_nothing_left(warren, live):
    """What belongs to sandboxes is exactly what the live ones hold."""
    runtime = harness.live_runtime_ids(warren)
    assert runtime == set(live), f"runtime holds {sorted(runtime)}, expected {sorted(live)}"
    links = harness.host_links()
    assert len(links) == len(live), f"veths {links} for live sandboxes {sorted(live)}"
    ports = harness.nft_elements("bridge", "ports")
    assert len(ports) == len(live), f"nft ports {ports} for live sandboxes {sorted(live)}"


def test_a_killed_supervisor_is_replaced_and_the_sandbox_runs_on(warren):
    sandbox_id, before = harness.start_counter(warren)
    (old,) = _supervisors(sandbox_id)
    os.kill(old, signal.SIGKILL)
    harness.wait_until("the supervisor is gone", lambda: old not in _supervisors(sandbox_id) or None)
    # The server's periodic look at the host (or any list of sandboxes) replaces it.
    new = harness.wait_until(
        "a new supervisor watches the sandbox",
        lambda: (lambda found: found if found and old not in found else None)(_supervisors(sandbox_id)),
    )
    assert len(new) == 1, new
    assert _state(warren, sandbox_id)["state"] == "running"
    assert harness.read_counter(sandbox_id) > before, "the sandbox's processes ran on"
    _check_nothing_left(warren, [sandbox_id])

    # Killed through the API, it leaves nothing behind: the new supervisor goes with it.
    status, _ = warren.api("DELETE", f"/sandboxes/{sandbox_id}")
    assert status == 204, status
    harness.wait_until("the supervisor ends with its sandbox", lambda: not _supervisors(sandbox_id) or None)
    _check_nothing_left(warren, [])


def test_a_killed_agent_marks_the_sandbox_lost_and_reclaims_it(warren):
    sandbox_id, _ = harness.start_counter(warren)
    keep_id, _ = harness.start_counter(warren)
    status, body = warren.api("GET", f"/sandboxes/{sandbox_id}")
    assert status == 200, body
    # `warren-supervisor wait <init pid> <sandbox dir>` names the sandbox's init.
    waiter = harness.wait_until(
        "the supervisor waits for the init",
        lambda: next(
            (cmd for _, cmd in harness.processes_mentioning(sandbox_id) if "warren-supervisor wait" in cmd), None
        ),
    )
    init = int(waiter.split()[2])
    os.kill(init, signal.SIGKILL)
    row = harness.wait_until(
        "the server notices the sandbox is gone",
        lambda: (lambda row: row if row["state"] != "running" else None)(_state(warren, sandbox_id)),
    )
    assert row["state"] == "failed", row
    assert "lost" in (row["state_reason"] or ""), row
    status, events = warren.api("GET", f"/events/sandboxes/{sandbox_id}")
    assert status == 200, events
    assert any("lost" in str(event) for event in events), events
    status, _ = warren.api("GET", f"/sandboxes/{sandbox_id}")
    assert status == 404
    harness.wait_until("its leftovers are reclaimed", lambda: harness.live_runtime_ids(warren) == {keep_id} or None)
    _check_nothing_left(warren, [keep_id])
    # The other sandbox never noticed, and new ones start as before.
    assert harness.read_counter(keep_id) > 0
    created, _ = harness.start_counter(warren)
    _check_nothing_left(warren, [keep_id, created])
