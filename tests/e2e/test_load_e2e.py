"""A short load run (issue 16; `scripts/load-test` is the long one): 60 sandboxes created and killed by
8 concurrent clients through the official SDK while another client runs commands in a sandbox of its
own. Every call either works or is a documented 429 or 507 (the server's sandbox limit, the disk room
admission keeps for every running sandbox's writable layer; such a create is tried again), every sandbox
created is killed, and no command round trip fails. The round-trip times are printed, not asserted:
speed is the benchmark's business."""

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from load import run_load  # noqa: E402


def test_concurrent_creates_and_kills_leave_no_error_and_no_sandbox(sdk_env):
    result = run_load(sandboxes=60, clients=8, idle_samples=20, bound_s=600)
    print(result.summary())
    assert result.errors == [], result.errors[:5]
    assert result.exec_errors == [], result.exec_errors[:5]
    assert result.created == 60 and result.killed == 60, result.summary()
    assert result.exec_loaded_ms, "the probe ran no command while the clients worked"
    api = httpx.Client(
        base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": sdk_env["E2B_API_KEY"]}, timeout=60
    )
    with api:
        left = api.get("/sandboxes").json()
    created_here = [s for s in left if s.get("metadata", {}).get("load") == "1"]
    assert created_here == [], created_here
