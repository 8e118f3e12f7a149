"""The crash a new user hit: `warren` killed with SIGKILL in the middle of `pause()` of a sandbox
running a counter. After the restart the sandbox must come back whole (network up, agent reachable,
counter counting on from where it was) or be recorded failed with its checkpoint kept.

The kill lands at a point chosen by watching the host, not by a timer: while the network is locked
(the veth's host side held down for the dump) and while `criu dump` runs.
"""

import subprocess
import sys
import threading
import time

import pytest

import harness


def _skip_if_missing():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)


def _link_down(name: str) -> bool:
    out = subprocess.run(["ip", "-o", "link", "show", "dev", name], capture_output=True, text=True).stdout
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
    return bool(out) and "UP" not in flags


def _criu_dumping() -> bool:
    return any("criu" in cmd for _, cmd in harness.processes_mentioning(" dump --tree "))


@pytest.mark.parametrize("point", ["network-locked", "criu-dumping"])
def test_sigkill_inside_pause_leaves_a_whole_sandbox(point):
    _skip_if_missing()
    warren = harness.Warren()
    model = harness.Model()
    try:
        warren.start()
        sandbox_id, value = harness.start_counter(warren)
        model.counters[sandbox_id] = value
        (veth,) = harness.host_links()
        model.counters[sandbox_id] = harness.read_counter(sandbox_id)

        reached = _link_down if point == "network-locked" else (lambda _veth: _criu_dumping())
        # The point lasts a dump (a few hundred ms); should the pause finish before a scan of /proc
        # sees it, the sandbox is resumed and paused again.
        for _attempt in range(10):
            done = threading.Event()

            def pause():
                try:
                    warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
                except OSError:
                    pass  # the connection dies with the server
                done.set()

            threading.Thread(target=pause, daemon=True).start()
            if harness.wait_until(
                f"pause reaches {point} or ends",
                lambda: reached(veth) or (done.is_set() and "ended"),
                limit=60,
                pause=0.001,
            ) is True:
                break
            model.counters[sandbox_id] = harness.read_counter(sandbox_id)  # resumes it
            (veth,) = harness.host_links()
        else:
            raise AssertionError(f"10 pauses ended before {point} was seen")
        warren.sigkill()
        sys.__stderr__.write(f"\nkilled warren at {point}\n")

        warren.start()
        states = harness.check_after_restart(warren, model, {sandbox_id})
        # check_after_restart resumed it (connect) and read the counter: it counted on.
        assert states[sandbox_id] == "running", states
        box = harness.sdk().connect(sandbox_id, timeout=600)
        assert box.commands.run("echo reachable", timeout=60).stdout.strip() == "reachable"
        # And it pauses and resumes normally afterwards.
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
        assert status == 204, (status, body)
        before = model.counters[sandbox_id]
        assert harness.read_counter(sandbox_id) >= before
    finally:
        warren.cleanup()
        warren.log_path.unlink(missing_ok=True)
