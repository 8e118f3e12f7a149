"""A full state disk (issue 16): `warren up` on a small loop-mounted state directory that something
else fills to the last block. Pause, a filesystem pause, create and a template build are each refused
with 507 naming the full state disk; nothing changes (the sandbox runs on, its process alive); once
space is freed, the same pause works and the resume gives back the same process.

Runs in a network namespace of its own (scripts/private-netns), like the other crash tests.
"""

import os
import subprocess
import sys
import tempfile

import pytest

import harness

# Sparse: the image takes only what is written. Large enough for admission's reserve of a
# sandbox's writable layer (2 GiB) and the store.
STATE_DISK = "8G"


@pytest.fixture
def small_state_dir():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    image = tempfile.mktemp(prefix="wt-fullstate-", suffix=".img")
    mount = tempfile.mkdtemp(prefix="wt-fullstate-")
    subprocess.run(["truncate", "-s", STATE_DISK, image], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    subprocess.run(["mount", "-o", "loop", image, mount], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)
        os.unlink(image)
        os.rmdir(mount)


def _fill(mount):
    """Takes every free block, the ones reserved for root included (warren runs as root)."""
    filler = os.path.join(mount, "filler")
    stat = os.statvfs(mount)
    subprocess.run(["fallocate", "-l", str(stat.f_bfree * stat.f_frsize), filler], check=False)
    # What the first call could not take (metadata rounding), a second one takes.
    for n in range(8):
        if os.statvfs(mount).f_bfree == 0:
            break
        subprocess.run(["fallocate", "-l", "1M", f"{filler}-{n}"], check=False)
    return filler


def _assert_full(answer):
    status, body = answer
    assert status == 507, answer
    assert "disk" in body["message"], body
    assert body.get("error_code") == "insufficient_storage", body


def _sleeper(sandbox_id):
    """The pid of the sandbox's `sleep 424242`, or None."""
    box = harness.sdk().connect(sandbox_id, timeout=600)
    out = box.commands.run("pgrep -f 'sleep 424242' || true", timeout=60).stdout.split()
    return out[0] if out else None


def test_a_full_state_disk_refuses_changes_with_507_and_loses_nothing(small_state_dir):
    warren = harness.Warren(os.path.join(small_state_dir, "state"))
    try:
        warren.start()
        # A process that lives in memory only: once something else fills the state disk, writes
        # inside a sandbox can fail at writeback (docs/reliability.md), a fault of its own that this
        # test keeps out of the way of the API's refusals.
        status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 3600})
        assert status == 201, (status, body)
        sandbox_id = body["sandboxID"]
        harness.sdk().connect(sandbox_id).commands.run("sleep 424242", background=True)
        sleeper = harness.wait_until("the sleeper runs", lambda: _sleeper(sandbox_id))
        filler = _fill(small_state_dir)

        _assert_full(warren.api("POST", f"/sandboxes/{sandbox_id}/pause"))
        _assert_full(warren.api("POST", f"/sandboxes/{sandbox_id}/pause", {"memory": False}))
        _assert_full(warren.api("POST", "/sandboxes", {"templateID": "base"}))
        rows = {row["id"]: row for row in warren.rows()}
        assert rows[sandbox_id]["state"] == "running", rows[sandbox_id]
        assert _sleeper(sandbox_id) == sleeper, "the sandbox ran on"

        os.environ.update(E2B_API_KEY=warren.api_key, E2B_API_URL=warren.api_url, E2B_SANDBOX_URL=warren.sandbox_url)
        from e2b import Template
        from e2b.exceptions import BuildException

        with pytest.raises(BuildException) as refused:
            Template.build(Template().from_template("base").run_cmd("echo x > /tmp/x"), alias="wt-full-disk")
        assert "507" in str(refused.value) and "disk is full" in str(refused.value), refused.value

        for name in os.listdir(small_state_dir):
            if name.startswith("filler"):
                os.unlink(os.path.join(small_state_dir, name))
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/pause")
        assert status == 204, (status, body)
        status, body = warren.api("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        assert status == 201, (status, body)
        assert _sleeper(sandbox_id) == sleeper, "the resume gave back the same process"
        assert not os.path.exists(filler)
    finally:
        warren.cleanup()
