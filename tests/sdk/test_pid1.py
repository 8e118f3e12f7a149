"""The agent as PID 1 of a fresh PID namespace (what a sandbox gives it): it reaps orphans,
survives signals its children send it, and on SIGTERM passes the signal on and exits cleanly."""

import os
import shutil
import signal
import subprocess

import pytest

from conftest import IS_ROOT, RunningAgent, wait_until


@pytest.fixture
def pid1_agent(agent_binary):
    if not IS_ROOT or shutil.which("unshare") is None:
        pytest.skip("SKIP: PID-namespace tests need root and unshare(1)")
    agent = RunningAgent(agent_binary, wrapper=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))
    yield agent
    agent.stop()


def agent_host_pid(agent) -> int:
    """The agent is the only child of the `unshare` process."""
    with open(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children") as f:
        return int(f.read().split()[0])


def test_agent_is_pid1_and_reaps_orphans(pid1_agent):
    sbx = pid1_agent.sandbox()
    assert sbx.commands.run("echo $PPID").stdout.strip() == "1"
    # Twenty orphans that exit at once: all reparented to PID 1, which must reap them.
    sbx.commands.run("for i in $(seq 20); do sh -c 'sleep 0.05 &'; done")

    def no_zombies():
        out = sbx.commands.run("cat /proc/[0-9]*/stat 2>/dev/null || true").stdout
        states = [line.rsplit(")", 1)[1].split()[0] for line in out.splitlines() if ")" in line]
        return "Z" not in states

    wait_until(no_zombies, "orphans to be reaped")


def test_signals_from_children_do_not_kill_pid1(pid1_agent):
    sbx = pid1_agent.sandbox()
    sbx.commands.run("kill -KILL 1; kill -SEGV 1; kill -HUP 1; kill -INT 1; true", user="root")
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_sigterm_is_forwarded_and_the_agent_exits_cleanly(pid1_agent):
    sbx = pid1_agent.sandbox()
    marker = pid1_agent.root / "tmp" / "got-term"
    handle = sbx.commands.run(
        f"trap 'touch {marker}; exit 0' TERM; echo ready; while true; do sleep 0.05; done",
        background=True,
    )
    for stdout, _, _ in handle:
        if stdout and "ready" in stdout:
            break  # the trap is installed
    os.kill(agent_host_pid(pid1_agent), signal.SIGTERM)
    assert pid1_agent.proc.wait(timeout=60) == 0
    assert marker.exists()
