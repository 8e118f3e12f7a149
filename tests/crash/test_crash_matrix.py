"""The crash matrix, short and seeded: one SIGKILL of `warren up` inside each of create, kill, pause,
resume, fork and snapshot, at a seeded random point; after every restart everything
harness.check_after_restart promises must hold. scripts/crash-matrix runs the same thing long.

WT_CRASH_SEED and WT_CRASH_KILLS change the seed and the number of kills (a failure prints both).
"""

import os
import sys

import pytest

import harness


def test_short_seeded_crash_matrix():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    seed = int(os.environ.get("WT_CRASH_SEED", "16"))
    kills = int(os.environ.get("WT_CRASH_KILLS", str(len(harness.OPERATIONS))))
    lines = []
    try:
        results = harness.run_matrix(kills, seed, report=lines.append, max_live=2)
    except BaseException:
        sys.__stderr__.write("\n".join(lines) + f"\ncrash matrix failed: seed {seed}, kills {kills}\n")
        raise
    sys.__stderr__.write("\n" + "\n".join(lines) + "\n")
    assert len(results) == kills
    assert {r["op"] for r in results} >= set(harness.OPERATIONS[: min(kills, len(harness.OPERATIONS))])
