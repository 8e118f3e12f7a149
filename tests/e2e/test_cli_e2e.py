"""The `warren` CLI against a real `warren up`: sandbox lifecycle, exec exit codes, the interactive shell
on a real terminal, templates, keys, and the documented exit codes."""

import json
import os
import pty
import select
import subprocess
import time


# Bound on one wait (not a speed assertion).
COMMAND_WAIT_S = 300
EXIT_NOT_FOUND = 3
EXIT_AUTH = 4


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def test_cli_sandbox_lifecycle(warren):
    created = json.loads(_ok(warren.cli("sandbox", "create", "base", "--timeout", "300", "-m", "suite=wt-e2e-cli", "--json")).stdout)
    sandbox_id = created["sandboxID"]
    try:
        listed = json.loads(_ok(warren.cli("sandbox", "list", "--json", "-m", "suite=wt-e2e-cli")).stdout)
        assert [s["sandboxID"] for s in listed] == [sandbox_id]
        assert listed[0]["state"] == "running"

        table = _ok(warren.cli("sandbox", "list")).stdout.splitlines()
        assert table[0].split()[:3] == ["ID", "TEMPLATE", "STATE"]
        assert any(line.startswith(sandbox_id) for line in table[1:]), table

        detail = json.loads(_ok(warren.cli("sandbox", "get", sandbox_id, "--json")).stdout)
        assert detail["sandboxID"] == sandbox_id
        assert detail["metadata"] == {"suite": "wt-e2e-cli"}

        # exec: output passes through and so does the exit code.
        ran = warren.cli("sandbox", "exec", sandbox_id, "--", "echo", "out;", "echo", "err", ">&2;", "exit", "5")
        assert ran.returncode == 5, ran
        assert ran.stdout == "out\n" and ran.stderr == "err\n", ran
        ran = json.loads(warren.cli("sandbox", "exec", sandbox_id, "--json", "--", "pwd").stdout)
        assert ran == {"stdout": "/home/user\n", "stderr": "", "exitCode": 0}
        _ok(warren.cli("sandbox", "exec", sandbox_id, "--cwd", "/tmp", "-e", "WT=1", "--", 'test "$PWD:$WT" = /tmp:1'))

        _ok(warren.cli("sandbox", "timeout", sandbox_id, "120"))

        paused = warren.cli("sandbox", "pause", sandbox_id)
        if paused.returncode == 0:
            state = json.loads(_ok(warren.cli("sandbox", "get", sandbox_id, "--json")).stdout)["state"]
            assert state == "paused"
            _ok(warren.cli("sandbox", "resume", sandbox_id))
            state = json.loads(_ok(warren.cli("sandbox", "get", sandbox_id, "--json")).stdout)["state"]
            assert state == "running"
            assert _ok(warren.cli("sandbox", "exec", sandbox_id, "--", "echo", "back")).stdout == "back\n"
            # Files only: a file stays, a background process does not.
            _ok(warren.cli("sandbox", "exec", sandbox_id, "--", "echo kept > ~/cli.txt; setsid sleep 555 >/dev/null 2>&1 &"))
            _ok(warren.cli("sandbox", "pause", sandbox_id, "--files-only", "--strict"))
            _ok(warren.cli("sandbox", "resume", sandbox_id))
            after = _ok(warren.cli("sandbox", "exec", sandbox_id, "--", "cat ~/cli.txt; pgrep -x sleep || echo none"))
            assert after.stdout == "kept\nnone\n", after
            # A memory pause, then a reboot that ignores it.
            _ok(warren.cli("sandbox", "exec", sandbox_id, "--", "setsid sleep 556 >/dev/null 2>&1 &"))
            _ok(warren.cli("sandbox", "pause", sandbox_id))
            _ok(warren.cli("sandbox", "resume", sandbox_id, "--reboot"))
            after = _ok(warren.cli("sandbox", "exec", sandbox_id, "--", "cat ~/cli.txt; pgrep -x sleep || echo none"))
            assert after.stdout == "kept\nnone\n", after
        else:
            # Pausing may be refused on a host that cannot freeze; it must say so, not crash.
            assert paused.returncode in (1, 5), paused
            assert paused.stderr.startswith("warren: error:"), paused
    finally:
        _ok(warren.cli("sandbox", "kill", sandbox_id))
    gone = warren.cli("sandbox", "get", sandbox_id)
    assert gone.returncode == EXIT_NOT_FOUND, gone


def test_cli_shell_on_a_real_terminal(warren):
    sandbox_id = _ok(warren.cli("sandbox", "create")).stdout.strip()
    try:
        master, slave = pty.openpty()
        process = subprocess.Popen(
            [warren.binary, "sandbox", "shell", sandbox_id],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, **warren.env, "TERM": "xterm"},
            start_new_session=True,
        )
        os.close(slave)
        os.write(master, b"echo $((6*7))-shell\r")
        seen = _read_until(master, b"42-shell", process)
        os.write(master, b"exit 3\r")
        process.wait(timeout=COMMAND_WAIT_S)
        os.close(master)
        assert b"42-shell" in seen
        assert process.returncode == 3
    finally:
        _ok(warren.cli("sandbox", "kill", sandbox_id))


def _read_until(fd: int, needle: bytes, process) -> bytes:
    """Reads the terminal until `needle` appears (bounded wait; the assertion is on content)."""
    deadline = time.monotonic() + COMMAND_WAIT_S
    data = b""
    while needle not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        elif process.poll() is not None:
            break
    return data


def test_cli_shell_refuses_without_a_terminal(warren):
    result = warren.cli("sandbox", "shell", "wt-any", input="")
    assert result.returncode == 2, result
    assert "terminal" in result.stderr


def test_cli_templates_include_base(warren):
    templates = json.loads(_ok(warren.cli("template", "list", "--json")).stdout)
    assert any(t["templateID"] == "base" or "base" in t.get("aliases", []) for t in templates), templates


def test_cli_not_found_and_auth_exit_codes(warren):
    missing = warren.cli("sandbox", "get", "wt-no-such-sandbox")
    assert missing.returncode == EXIT_NOT_FOUND, missing
    assert missing.stderr.startswith("warren: error:"), missing

    bad_key = warren.cli("sandbox", "list", env={"E2B_API_KEY": "e2b_wt_wrong"})
    assert bad_key.returncode == EXIT_AUTH, bad_key

    as_json = warren.cli("sandbox", "get", "wt-no-such-sandbox", "--json")
    assert json.loads(as_json.stderr)["exitCode"] == EXIT_NOT_FOUND


def test_cli_keys_create_list_revoke(warren):
    state = ["--state-dir", warren.state_dir]
    created = json.loads(_ok(warren.cli("key", "create", "--name", "wt-e2e-key", "--json", *state)).stdout)
    secret, key_id = created["key"], created["id"]
    assert _ok(warren.cli("sandbox", "list", env={"E2B_API_KEY": secret}))

    listed = json.loads(_ok(warren.cli("key", "list", "--json", *state)).stdout)
    mine = [k for k in listed if k["id"] == key_id]
    assert len(mine) == 1 and mine[0]["name"] == "wt-e2e-key"
    assert secret not in json.dumps(listed)

    _ok(warren.cli("key", "revoke", key_id, *state))
    refused = warren.cli("sandbox", "list", env={"E2B_API_KEY": secret})
    assert refused.returncode == EXIT_AUTH, refused

    again = warren.cli("key", "revoke", key_id, *state)
    assert again.returncode == EXIT_NOT_FOUND, again
