"""`warren down` (issue 18): one server per state directory, and the way to stop it and everything
it started. A second `warren up` on a state dir in use is refused naming the first; `warren down
--kill-sandboxes` stops the server and leaves no sandbox, supervisor, link or mount of that state dir
behind. Runs in a network namespace of its own (scripts/private-netns), like the crash tests."""

import subprocess
import sys
import time

import pytest

import harness


def _warren(*args, timeout=180):
    return subprocess.run(
        [str(harness.warren_binary()), *args], capture_output=True, text=True, timeout=timeout
    )


def test_down_stops_the_server_and_everything_it_started():
    reason = harness.missing_prerequisite()
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    warren = harness.Warren()
    try:
        warren.start()
        pid = warren.process.pid
        second = _warren(
            "up", "--listen", f"127.0.0.1:{harness.free_port()}",
            "--proxy-listen", f"127.0.0.1:{harness.free_port()}",
            "--state-dir", str(warren.state_dir), "--agent", str(harness.agent_binary()),
            "--base-rootfs", str(harness.base_rootfs()), "--no-code-interpreter",
            timeout=60,
        )
        assert second.returncode != 0, second.stdout
        assert f"another warren server (pid {pid}) runs on" in second.stderr, second.stderr

        made = []
        for _ in range(2):
            status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
            assert status == 201, body
            made.append(body["sandboxID"])
        status, body = warren.api("POST", f"/sandboxes/{made[1]}/pause")
        assert status == 204, body
        assert harness.processes_mentioning(str(warren.state_dir)), "the sandboxes run"

        down = _warren(
            "down", "--state-dir", str(warren.state_dir), "--kill-sandboxes",
            "--agent", str(harness.agent_binary()),
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"stopped the warren server (pid {pid})" in down.stdout, down.stdout
        assert "killed 2 sandbox(es)" in down.stdout, down.stdout
        assert warren.process.wait(timeout=10) is not None
        warren.process = None

        assert {row["state"] for row in warren.rows()} == {"killed"}, warren.rows()
        assert harness.live_runtime_ids(warren) == set()
        harness.wait_until(
            "no process of the state dir", lambda: not harness.processes_mentioning(str(warren.state_dir)), 30
        )
        mounts = [line for line in open("/proc/mounts") if str(warren.state_dir) in line]
        assert mounts == [], mounts
        assert harness.host_links() == [], harness.host_links()

        again = _warren("down", "--state-dir", str(warren.state_dir))
        assert again.returncode == 0 and "no warren server runs on" in again.stdout, again.stdout
    finally:
        if warren.process is not None:
            warren.process.kill()
            warren.process.wait()
            warren.process = None
        time.sleep(0.1)
        warren.cleanup()
