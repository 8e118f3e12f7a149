"""SIGKILL of `warren` inside its own start-up reconciliation (issue 16): a state dir with a running
sandbox, one paused to a checkpoint and one caught mid-pause by a first kill (and one more running);
then starts killed at seeded points of their first few hundred milliseconds (reconciling, recovering
the runtime, settling the cut-short pause), again and again. The start that finally finishes must
leave everything as the crash checks demand (docs/reliability.md), and every sandbox resumable with
its counter counting on.

Runs in a network namespace of its own (scripts/private-netns), like the other crash tests.
"""

import os
import random
import sys

import pytest

import harness

SEED = int(os.environ.get("WARREN_CRASH_SEED", "11"))
KILLED_STARTS = 5


def test_kills_inside_reconciliation_settle_on_the_next_start():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    rng = random.Random(SEED)
    warren = harness.Warren()
    model = harness.Model()
    try:
        warren.start()
        for _ in range(4):
            sandbox_id, value = harness.start_counter(warren)
            model.counters[sandbox_id] = value
        running, checkpointed, cut_short, _ = list(model.counters)
        status, body = warren.api("POST", f"/sandboxes/{checkpointed}/pause")
        assert status == 204, (status, body)
        # The last one's pause is cut short by the first kill.
        harness.run_cut_short(warren, "pause", cut_short, rng.uniform(0.0, 0.3))
        for _ in range(KILLED_STARTS):
            warren.start_and_sigkill(rng.uniform(0.0, 0.2))
        warren.start()
        states = {row["id"]: row["state"] for row in warren.rows()}
        assert states[running] == "running", states
        assert states[checkpointed] == "paused", states
        # Resumes what is paused and checks each counter went on, besides the leftovers.
        harness.check_after_restart(warren, model, set(model.counters))
        states = {row["id"]: row["state"] for row in warren.rows()}
        for sandbox_id, before in model.counters.items():
            if states[sandbox_id] in ("running", "paused"):
                assert harness.read_counter(sandbox_id) >= before, sandbox_id
    finally:
        warren.cleanup()
