"""Volumes through the official E2B Python SDK against a real `warren up` (real ext4 images, loop
devices and bind mounts): two sandboxes share one volume at once; the volume outlives them; its size
is a quota (ENOSPC inside); the content API and sandboxes see each other's files; a wrong token is
refused; pause/resume keeps a process holding a file open on the volume; a fork sees the volume.

The server's volumes are 1 GiB by default; the quota test fills one with `dd` (sparse image: the
disk use goes away with the volume).
"""

import json
import sys
import time
import urllib.request
import uuid

import pytest

# Bounds for waits (not assertions on speed).
WAIT_S = 120


@pytest.fixture(scope="module")
def volume_env(sdk_env, monkeypatch_session):
    # The SDK sends the content API to E2B_VOLUME_API_URL (else https://api.<domain>).
    monkeypatch_session.setenv("E2B_VOLUME_API_URL", sdk_env["E2B_API_URL"])
    return sdk_env


def _checkpointing(env):
    with urllib.request.urlopen(f"{env['E2B_API_URL']}/health", timeout=30) as answer:
        health = json.load(answer)
    if not health.get("checkpoint"):
        sys.__stderr__.write("SKIP: this host cannot take CRIU checkpoints (/health: checkpoint=false)\n")
        pytest.skip("no CRIU checkpoints on this host")


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(what, probe):
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as error:  # noqa: BLE001 - reported below if it never passes
            last = error
        time.sleep(0.3)
    raise AssertionError(f"{what}: still not so after {WAIT_S} s (last: {last!r})")


def _kill(*sandboxes):
    for sandbox in sandboxes:
        try:
            sandbox.kill()
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


def test_two_sandboxes_share_a_volume_that_outlives_them(volume_env):
    from e2b import Sandbox, Volume

    volume = Volume.create(_name("shared"))
    first = second = third = None
    try:
        first = Sandbox.create(template="base", timeout=300, volume_mounts={"/mnt/shared": volume})
        second = Sandbox.create(template="base", timeout=300, volume_mounts={"/mnt/shared": volume.name})
        # Both write at once, each a file of its own and lines into one common file.
        writer = "for i in $(seq 1 50); do echo {who}-$i >> /mnt/shared/common; echo {who} > /mnt/shared/{who}; done"
        one = first.commands.run(writer.format(who="first"), background=True)
        two = second.commands.run(writer.format(who="second"), background=True)
        one.wait()
        two.wait()
        for sandbox in (first, second):
            listing = sandbox.commands.run("cat /mnt/shared/first /mnt/shared/second; wc -l < /mnt/shared/common")
            assert listing.stdout.split() == ["first", "second", "100"], listing.stdout
        # The content API reads what a sandbox wrote, and a sandbox reads what it wrote.
        assert volume.read_file("/first") == "first\n"
        volume.write_file("/from-api/note.txt", "written through the API", force=True)
        assert first.commands.run("cat /mnt/shared/from-api/note.txt").stdout == "written through the API"
        names = sorted(entry.name for entry in volume.list("/"))
        assert names == ["common", "first", "from-api", "second"], names

        first.kill()
        second.kill()
        first = second = None
        third = Sandbox.create(template="base", timeout=300, volume_mounts={"/data": volume})
        assert third.commands.run("cat /data/second").stdout == "second\n"
        third.kill()
        third = None
        assert Volume.destroy(volume.volume_id)
        volume = None
    finally:
        _kill(*(s for s in (first, second, third) if s))
        if volume is not None:
            Volume.destroy(volume.volume_id)


def test_a_full_volume_is_enospc_inside(volume_env):
    from e2b import Sandbox, Volume
    from e2b.sandbox.commands.command_handle import CommandExitException

    volume = Volume.create(_name("quota"))
    sandbox = None
    try:
        sandbox = Sandbox.create(template="base", timeout=300, volume_mounts={"/q": volume})
        try:
            result = sandbox.commands.run("dd if=/dev/zero of=/q/fill bs=1M count=1400 2>&1", timeout=600)
            output, code = result.stdout + result.stderr, result.exit_code
        except CommandExitException as error:
            output, code = error.stdout + error.stderr, error.exit_code
        assert code != 0, output
        assert "No space left on device" in output, output
    finally:
        _kill(*(s for s in (sandbox,) if s))
        Volume.destroy(volume.volume_id)


def test_a_wrong_volume_token_is_refused(volume_env):
    from e2b import Volume
    from e2b.exceptions import AuthenticationException, VolumeException

    volume = Volume.create(_name("token"))
    try:
        stranger = Volume(volume.volume_id, volume.name, token="not-the-token")
        with pytest.raises((AuthenticationException, VolumeException)):
            stranger.read_file("/anything")
        listed = [v.volume_id for v in Volume.list()]
        assert volume.volume_id in listed
    finally:
        Volume.destroy(volume.volume_id)


def test_pause_resume_and_fork_keep_the_volume(volume_env):
    _checkpointing(volume_env)
    from e2b import Sandbox, Volume

    volume = Volume.create(_name("ckpt"))
    sandbox = resumed = None
    forks = []
    try:
        sandbox = Sandbox.create(template="base", timeout=600, volume_mounts={"/v": volume})
        # A process that keeps a file on the volume open and appends to it through that descriptor.
        sandbox.commands.run(
            "sh -c 'exec 3>>/v/log; i=0; while true; do i=$((i+1)); echo $i >&3; sleep 0.2; done'",
            background=True,
        )
        _wait("the writer starts", lambda: volume.get_info("/log").size > 0)
        sandbox.pause()
        size_paused = volume.get_info("/log").size
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
        # The same process, its descriptor on the volume intact, goes on writing.
        _wait("the writer writes after the resume", lambda: volume.get_info("/log").size > size_paused)
        pids = resumed.commands.run("pgrep -f 'exec 3>>/v/log' || true").stdout.split()
        assert pids, "the writer survived pause/resume"

        forks = resumed.fork(count=1, timeout=300)
        fork = forks[0]
        assert not isinstance(fork, Exception), fork
        fork.commands.run("echo from-fork > /v/fork-note")
        assert volume.read_file("/fork-note") == "from-fork\n"
        assert resumed.commands.run("cat /v/fork-note").stdout == "from-fork\n"
    finally:
        _kill(*[f for f in forks if not isinstance(f, Exception)])
        _kill(*(s for s in (resumed or sandbox,) if s))
        Volume.destroy(volume.volume_id)
