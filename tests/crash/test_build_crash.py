"""SIGKILL of `warren` inside a template build (issue 16), at seeded random points of a build that
writes a 30 MiB layer, runs a second step and starts a start command. After each restart: the build is
`error` with the reason ("the server stopped before this build finished") or `ready` if it finished,
its build sandbox is gone (no runtime directory, link or supervisor), no half-written layer is left
in the layer cache, and a build of the same template then succeeds.

Runs in a network namespace of its own (scripts/private-netns), like the other crash tests.
"""

import os
import random
import sqlite3
import sys
import threading
import time

import pytest

import harness

SEED = int(os.environ.get("WARREN_CRASH_SEED", "7"))
KILLS = 4


def _template(n):
    from e2b import Template

    return (
        Template()
        # The Debian image maps to the local root filesystem: no network needed (E2B's `base` adds
        # packages with apt, which this network namespace cannot reach).
        .from_image("debian:bookworm")
        .run_cmd(f"dd if=/dev/urandom of=/home/user/blob bs=1M count=30 2>/dev/null; echo {n} > /home/user/n")
        .run_cmd("sleep 1")
        .set_start_cmd("sleep infinity", "true")
    )


def _builds(warren):
    db = sqlite3.connect(f"file:{warren.state_dir / 'warren.db'}?mode=ro", uri=True, timeout=30)
    try:
        return [dict(zip(("status", "reason"), row)) for row in db.execute("SELECT status, reason FROM template_builds")]
    finally:
        db.close()


def _layer_debris(warren):
    layers = warren.state_dir / "layers"
    return [p.name for p in layers.iterdir() if p.name.startswith(".tmp-")] if layers.is_dir() else []


def test_a_build_cut_short_by_sigkill_leaves_an_error_and_nothing_else():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    rng = random.Random(SEED)
    warren = harness.Warren()
    try:
        warren.start()
        os.environ.update(E2B_API_KEY=warren.api_key, E2B_API_URL=warren.api_url, E2B_SANDBOX_URL=warren.sandbox_url)
        from e2b import Template

        for n in range(KILLS):
            thread = threading.Thread(
                target=lambda n=n: _quietly(lambda: Template.build(_template(n), alias=f"wt-crash-build-{n}")),
                daemon=True,
            )
            thread.start()
            delay = rng.uniform(0.2, 6.0)
            time.sleep(delay)
            warren.sigkill()
            warren.start()
            builds = _builds(warren)
            assert builds, "no build row"
            for build in builds:
                assert build["status"] in ("error", "ready"), (delay, builds)
                if build["status"] == "error":
                    assert build["reason"], (delay, builds)
            assert not harness.live_runtime_ids(warren), (delay, harness.live_runtime_ids(warren))
            assert not harness.host_links(), (delay, harness.host_links())
            supervisors = harness.processes_mentioning(str(warren.state_dir))
            assert not [p for p in supervisors if "warren-supervisor" in p[1]], (delay, supervisors)
            assert not _layer_debris(warren), (delay, _layer_debris(warren))
            thread.join(timeout=60)

        # The cache is whole: the same template builds and its sandbox has the step's output.
        Template.build(_template(0), alias="wt-crash-build-0")
        from e2b import Sandbox

        sandbox = Sandbox.create(template="wt-crash-build-0", timeout=120)
        try:
            assert sandbox.commands.run("cat /home/user/n").stdout == "0\n"
        finally:
            sandbox.kill()
    finally:
        warren.cleanup()


def _quietly(build):
    try:
        build()
    except Exception:  # noqa: BLE001 - the build is meant to be cut short; the store is checked
        pass
