"""`warren gc` (issue 18): a server killed with SIGKILL and its state directory removed by hand leave
running sandboxes nobody can list; `warren gc --dry-run` names them (supervisor, cgroup, mounts,
lxcfs) and changes nothing, `warren gc` removes every process, mount, cgroup, link and firewall entry
of them, and a live server's sandbox beside them is left alone. Runs in a network namespace of its own
(scripts/private-netns), like the crash tests."""

import json
import os
import subprocess
import sys

import pytest

import harness


def _gc(*args):
    done = subprocess.run(
        [str(harness.warren_binary()), "--json", "gc", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _cgroups_of(sandbox_id):
    found = []
    for controller in os.listdir("/sys/fs/cgroup"):
        path = os.path.join("/sys/fs/cgroup", controller, "warren", sandbox_id)
        if os.path.isdir(path):
            found.append(path)
    path = os.path.join("/sys/fs/cgroup/warren", sandbox_id)
    if os.path.isdir(path):
        found.append(path)
    return found


def _mounts_of(text):
    return [line for line in open("/proc/mounts") if text in line]


def test_gc_removes_what_a_deleted_state_dir_left_and_nothing_else():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    lost = harness.Warren()
    live = None
    try:
        lost.start()
        status, body = lost.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
        assert status == 201, body
        lost_id = body["sandboxID"]
        assert len(harness.nft_elements("bridge", "ports")) == 1, "the sandbox's port binding"
        lost.sigkill()
        # What a user does: the state directory goes, as far as `rm` can take it (busy mount points stay).
        subprocess.run(["rm", "-rf", str(lost.state_dir)], check=False, capture_output=True, timeout=120)
        assert not (lost.state_dir / "warren.db").exists()
        assert harness.processes_mentioning(str(lost.state_dir)), "the sandbox runs on, unlisted"

        listed = _gc("--dry-run")
        mine = [s for s in listed["sandboxes"] if s["id"] == lost_id]
        assert len(mine) == 1, listed
        assert mine[0]["supervisors"] and mine[0]["cgroup"] and mine[0]["cgroupTasks"] > 0, mine
        assert any(m.startswith(str(lost.state_dir)) for m in mine[0]["mounts"]), mine
        assert str(lost.state_dir / "lxcfs") in listed["lxcfsMounts"], listed
        assert listed["removed"] is False
        assert harness.processes_mentioning(str(lost.state_dir)), "a dry run killed something"

        removed = _gc()
        assert removed["removed"] is True and removed["problems"] == [], removed
        harness.wait_until(
            "no process of the lost state dir",
            lambda: not harness.processes_mentioning(str(lost.state_dir)),
            30,
        )
        assert _mounts_of(str(lost.state_dir)) == []
        assert _cgroups_of(lost_id) == []
        harness.wait_until("no sandbox link left", lambda: harness.host_links() == [], 30)
        assert harness.nft_elements("bridge", "ports") == [], "the lost sandbox's port binding stayed"
        assert removed["firewallEntries"], removed

        # A live server's sandbox is its own, however gc looks at it.
        live = harness.Warren()
        live.start()
        status, body = live.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
        assert status == 201, body
        live_id = body["sandboxID"]
        again = _gc()
        assert live_id not in [s["id"] for s in again["sandboxes"]], again
        assert str(live.state_dir / "lxcfs") not in again["lxcfsMounts"], again
        status, body = live.api("GET", f"/sandboxes/{live_id}")
        assert status == 200 and body["state"] == "running", body
        assert _cgroups_of(live_id), "the live sandbox's cgroup went"
        assert harness.processes_mentioning(str(live.state_dir)), "the live sandbox's supervisor went"
        assert len(harness.nft_elements("bridge", "ports")) == 1, "the live sandbox's port binding went"
        assert again["firewallEntries"] == [], again
    finally:
        if lost.process is not None:
            lost.sigkill()
        lost.cleanup()
        if live is not None:
            live.cleanup()
