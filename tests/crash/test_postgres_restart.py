"""`warren up --database-url`: the real server with its store in PostgreSQL (docs/cluster.md).

The test starts its own private PostgreSQL cluster (Debian's `postgresql` binaries, `initdb` in a
temp dir as `nobody`, a unix socket in that dir, no TCP) and its own `warren up` twice, so it lives
with the restart tests that ./test runs in a private network namespace:

    scripts/private-netns .venv/bin/python -m pytest -q tests/crash/test_postgres_restart.py

It creates a sandbox, a team and keys, restarts the server on the same database and finds them all
again (the reconciler adopts the running sandbox from the PostgreSQL rows), and checks that the
database's password never reaches the server's log.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import (
    agent_binary,
    base_rootfs,
    free_port,
    missing_prerequisite,
    pg_bin,
    private_postgres,
    wait_until,
    warren_binary,
)

SERVER_START_WAIT_S = 120

PASSWORD = "pg-e2e-password-7f3a"


def skip(reason: str):
    sys.__stderr__.write(f"SKIP: {reason}\n")
    pytest.skip(reason)


def parse_exports(lines) -> dict:
    exports = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            exports[key] = value.strip().strip("'\"")
    return exports


def listening(port: int, process) -> bool:
    assert process.poll() is None, f"warren up exited with {process.returncode}"
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def postgres_url():
    reason = missing_prerequisite()
    if reason:
        skip(reason)
    if pg_bin() is None:
        skip("no PostgreSQL binaries (/usr/lib/postgresql/*/bin; install postgresql)")
    with private_postgres(PASSWORD) as postgres:
        # Trust authentication ignores the password; it is here to prove it never shows.
        yield postgres.url


class Server:
    def __init__(self, state_dir: str, database_url: str, log_path: str):
        self.api_port, self.proxy_port = free_port(), free_port()
        self.log_path = log_path
        self.lines = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") and not k.startswith("WARREN_")}
        env["WARREN_DATABASE_URL"] = database_url
        with open(log_path, "a") as log:
            self.process = subprocess.Popen(
                [str(warren_binary()), "up", "--listen", f"127.0.0.1:{self.api_port}", "--proxy-listen",
                 f"127.0.0.1:{self.proxy_port}", "--state-dir", state_dir, "--agent", str(agent_binary()),
                 "--base-rootfs", str(base_rootfs()), "--no-code-interpreter"],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            )
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        wait_until("warren up listening", lambda: listening(self.api_port, self.process), SERVER_START_WAIT_S)
        wait_until("warren up printing its exports", lambda: "E2B_API_URL" in self.exports(), 30)

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def exports(self) -> dict:
        return parse_exports(self.lines)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def call(method: str, url: str, key: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"X-API-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_the_store_in_postgresql_survives_a_restart(postgres_url):
    state_dir = tempfile.mkdtemp(prefix="wt-e2e-pg-state-")
    log_path = tempfile.mktemp(prefix="wt-e2e-pg-warren-", suffix=".log")
    server = Server(state_dir, postgres_url, log_path)
    sandbox_id = None
    key = None
    try:
        key = server.exports()["E2B_API_KEY"]
        # The store is not the state directory's SQLite file.
        assert not (Path(state_dir) / "warren.db").exists()
        status, created = call("POST", f"{server.url}/sandboxes", key, {"templateID": "base", "timeout": 600})
        assert status == 201, created
        sandbox_id = created["sandboxID"]
        # The CLI's key commands reach the same database through WARREN_DATABASE_URL.
        cli_env = {**os.environ, "WARREN_DATABASE_URL": postgres_url}
        team = subprocess.run([str(warren_binary()), "team", "create", "pg-e2e", "--state-dir", state_dir],
                              env=cli_env, capture_output=True, text=True, timeout=60)
        assert team.returncode == 0, team.stderr
        made = subprocess.run(
            [str(warren_binary()), "--json", "key", "create", "--name", "pg-e2e", "--team", "pg-e2e",
             "--state-dir", state_dir], env=cli_env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        team_key = json.loads(made.stdout)["key"]

        server.stop()
        server = Server(state_dir, postgres_url, log_path)
        # Keys exist in the database: no new one is made.
        assert "E2B_API_KEY" not in server.exports(), server.lines
        status, found = call("GET", f"{server.url}/sandboxes/{sandbox_id}", key)
        assert status == 200, found
        assert found["state"] == "running", found
        status, listed = call("GET", f"{server.url}/sandboxes", key)
        assert status == 200 and sandbox_id in [s["sandboxID"] for s in listed], listed
        # The team's key works and sees none of the default team's sandboxes.
        status, theirs = call("GET", f"{server.url}/sandboxes", team_key)
        assert (status, theirs) == (200, []), theirs
        status, _ = call("DELETE", f"{server.url}/sandboxes/{sandbox_id}", key)
        assert status == 204
        sandbox_id = None
        log = Path(log_path).read_text(errors="replace")
        assert "PostgreSQL at postgres://postgres:REDACTED@localhost/warren" in log, log[-3000:]
        assert PASSWORD not in log
        assert PASSWORD not in "".join(server.lines)
    finally:
        if sandbox_id is not None and key is not None:
            call("DELETE", f"{server.url}/sandboxes/{sandbox_id}", key)
        server.stop()
        subprocess.run(["umount", "-l", os.path.join(state_dir, "lxcfs")], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", state_dir], check=False)
        if os.path.exists(log_path):
            os.unlink(log_path)
