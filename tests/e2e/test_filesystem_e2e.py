"""Filesystem-only persistence through the official E2B Python SDK against a real `warren up`:
`pause(mode="filesystem")`, the filesystem auto-pause of `lifecycle`, `connect(on_resume="reboot")`,
`create_snapshot(mode="filesystem")` and `pause(strict=True)`. A filesystem pause keeps the files
(writes and deletions) and ends the processes; the resume boots fresh processes and runs the
template's start command again. None of this needs CRIU.
"""

import time

import pytest

# A bound on waits, not an assertion on speed.
WAIT_S = 120
TEMPLATE = "wt-e2e-fs-start"
# Each start of the template appends a line: the build's start, then one per boot.
START_CMD = "echo started >> /home/user/starts; sleep infinity"


def _wait(what, probe):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {WAIT_S}s")


@pytest.fixture(scope="module")
def start_template(sdk_env):
    from e2b import Template

    template = (
        Template()
        .from_template("base")
        .set_start_cmd(START_CMD, "test -f /home/user/starts")
    )
    Template.build(template, alias=TEMPLATE)
    return TEMPLATE


def _leave_traces(sandbox):
    """A file written, a file deleted and a process running: what a filesystem pause keeps and ends."""
    sandbox.files.write("/home/user/kept.txt", "kept across the pause")
    sandbox.commands.run("sudo rm /etc/motd")
    sandbox.commands.run("sleep 777", background=True)
    _wait("the sleeper runs", lambda: sandbox.commands.run("pgrep -x sleep -a || true").stdout.count("777"))


def _assert_booted_over_the_files(sandbox, starts):
    assert sandbox.files.read("/home/user/kept.txt") == "kept across the pause"
    assert sandbox.commands.run("test -e /etc/motd || echo gone").stdout == "gone\n"
    sleepers = sandbox.commands.run("pgrep -a sleep || true").stdout
    assert "777" not in sleepers, f"processes start fresh: {sleepers!r}"
    if starts is not None:
        assert sandbox.files.read("/home/user/starts") == "started\n" * starts
        assert "infinity" in sleepers, "the start command runs again"


def test_a_filesystem_pause_keeps_files_and_connect_boots_the_start_command_again(sdk_env, start_template):
    from e2b import Sandbox

    sandbox = Sandbox.create(template=start_template, timeout=300)
    try:
        assert sandbox.files.read("/home/user/starts") == "started\n"
        _leave_traces(sandbox)
        assert sandbox.pause(mode="filesystem")
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert resumed.get_info().state.value == "running"
        _assert_booted_over_the_files(resumed, starts=2)
        # Paused again the same way, the files keep accumulating.
        assert resumed.pause(mode="filesystem")
        again = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        _assert_booted_over_the_files(again, starts=3)
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_the_filesystem_auto_pause_at_timeout_resumes_by_booting(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(
        template="base",
        timeout=300,
        lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}},
    )
    try:
        _leave_traces(sandbox)
        sandbox.set_timeout(1)
        _wait(
            "the timeout pauses the sandbox",
            lambda: Sandbox.get_info(sandbox.sandbox_id).state.value == "paused",
        )
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        _assert_booted_over_the_files(resumed, starts=None)
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_reboot_ignores_the_memory_a_pause_kept(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=300)
    try:
        _leave_traces(sandbox)
        assert sandbox.pause()
        rebooted = Sandbox.connect(sandbox.sandbox_id, timeout=300, on_resume="reboot")
        _assert_booted_over_the_files(rebooted, starts=None)
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_filesystem_snapshot_starts_sandboxes_over_its_files(sdk_env, start_template):
    from e2b import Sandbox

    source = Sandbox.create(template=start_template, timeout=300)
    child = None
    try:
        _leave_traces(source)
        snapshot = source.create_snapshot(mode="filesystem")
        # The source runs on, its sleeper included.
        assert "777" in source.commands.run("pgrep -a sleep").stdout
        child = Sandbox.create(template=snapshot.snapshot_id, timeout=300)
        assert child.sandbox_id != source.sandbox_id
        _assert_booted_over_the_files(child, starts=2)
        assert child.commands.run("hostname").stdout.strip() == child.sandbox_id
    finally:
        for sandbox in (source, child):
            if sandbox is not None:
                Sandbox.kill(sandbox.sandbox_id)


def test_a_strict_pause_of_a_responding_sandbox_goes_ahead(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=300)
    try:
        sandbox.files.write("/home/user/strict.txt", "x")
        assert sandbox.pause(strict=True)
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert resumed.files.read("/home/user/strict.txt") == "x"
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_filesystem_pause_keeps_the_volume_mounted_after_the_boot(sdk_env):
    import uuid

    from e2b import Sandbox, Volume

    volume = Volume.create(f"wt-fs-{uuid.uuid4().hex[:8]}")
    sandbox = Sandbox.create(template="base", timeout=300, volume_mounts={"/mnt/vol": volume})
    try:
        sandbox.commands.run("echo on-the-volume > /mnt/vol/v.txt")
        assert sandbox.pause(mode="filesystem")
        booted = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert booted.commands.run("cat /mnt/vol/v.txt").stdout == "on-the-volume\n"
        # The volume is the same one, not a copy in the runtime layer: a write shows in the content API.
        booted.commands.run("echo after-boot > /mnt/vol/w.txt")
        assert volume.read_file("/w.txt") == "after-boot\n"
    finally:
        Sandbox.kill(sandbox.sandbox_id)
        Volume.destroy(volume.volume_id)
