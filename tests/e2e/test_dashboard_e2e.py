"""The web dashboard (docs/dashboard.md) in Debian's headless Chromium against a real `warren up`:
a 401 without a key, log in, a sandbox created through the API in the list, its terminal (`echo
$((6*7))` reads 42, Ctrl-C, top, htop, a file written and saved in vim, a resize, a 1 MB paste),
processes, the log tail pushing a running command's lines, events, a file uploaded and downloaded,
pause and resume from the buttons, a template build's log streaming while it runs, the fleet page's
latency chart and policy events (a runaway loop killed and orphans reaped, made here first), and log
out. The browser steps live in dashboard/tests/e2e.mjs (playwright-core); the screenshots it takes go
to docs/dashboard/."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx

from conftest import poll

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboard"
CHROMIUM = os.environ.get("WARREN_CHROMIUM", "/usr/bin/chromium")
SHOTS = REPO / "docs" / "dashboard"
BUILD_NAME = "wt-dash-build"
# A build that prints a numbered line every half second, so its log visibly streams.
DOCKERFILE = (
    "FROM debian:bookworm\n"
    "RUN for i in $(seq 1 20); do echo wt-dash-step-$i; sleep 0.5; done\n"
)
# A bound on waits, not a speed assertion: the monitor samples every second here.
POLICY_WAIT_S = 90


def _policy_findings(api: httpx.Client) -> str:
    """A sandbox on which two fleet-hygiene checks find something for the fleet page to list: a busy
    loop that its runaway policy kills, and an orphaned process reaped through the API. Returns its id."""
    from e2b import Sandbox

    made = api.post(
        "/sandboxes",
        json={
            "templateID": "base",
            "timeout": 600,
            "metadata": {"suite": "wt-dashboard"},
            "policies": {"runaway": {"cpuPercent": 50, "seconds": 2, "kill": True}},
        },
    )
    assert made.status_code == 201, made.text
    sandbox_id = made.json()["sandboxID"]
    sandbox = Sandbox.connect(sandbox_id)
    sandbox.commands.run("sh -c 'while :; do :; done' # wt-spin", background=True)
    assert sandbox.commands.run("(exec -a wt-orphan sleep 600 >/dev/null 2>&1 &); echo started").stdout == "started\n"
    poll("the orphan listed", lambda: api.get(f"/sandboxes/{sandbox_id}/orphans").json(), 30)
    reaped = api.delete(f"/sandboxes/{sandbox_id}/orphans")
    assert reaped.status_code == 200 and reaped.json(), reaped.text

    def runaway_found():
        logs = api.get(f"/v2/sandboxes/{sandbox_id}/logs", params={"limit": 1000}).json()["logs"]
        return any("runaway process" in line["message"] for line in logs)

    poll("the runaway loop found by the policy", runaway_found, POLICY_WAIT_S)
    return sandbox_id


def _missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/setup does)"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (DASHBOARD / "node_modules" / "playwright-core").is_dir():
        return "dashboard/node_modules missing (run scripts/setup)"
    return None


def test_dashboard_in_chromium(warren, sdk_env):
    reason = _missing()
    if reason:
        print(f"SKIP: {reason}")
        return
    api = httpx.Client(
        base_url=warren.api_url, headers={"X-API-Key": warren.env["E2B_API_KEY"]}, timeout=120
    )
    page = api.get("/dashboard/login")
    if page.status_code == 503:
        raise AssertionError(f"the server was built without the dashboard bundle: {page.text}")
    created = api.post(
        "/sandboxes", json={"templateID": "base", "timeout": 600, "metadata": {"suite": "wt-dashboard"}}
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    context = tempfile.mkdtemp(prefix="wt-dash-build-")
    try:
        policy_sandbox = _policy_findings(api)
        Path(context, "e2b.Dockerfile").write_text(DOCKERFILE)
        result = subprocess.run(
            ["node", "tests/e2e.mjs"],
            cwd=DASHBOARD,
            env={
                **os.environ,
                "WARREN_URL": warren.api_url,
                "WARREN_KEY": warren.env["E2B_API_KEY"],
                "SANDBOX_ID": sandbox_id,
                "POLICY_SANDBOX_ID": policy_sandbox,
                **warren.env,
                "WARREN_BIN": warren.binary,
                "BUILD_CONTEXT": context,
                "BUILD_TEMPLATE": BUILD_NAME,
                "SHOTS_DIR": str(SHOTS),
                "CHROMIUM": CHROMIUM,
            },
            capture_output=True,
            text=True,
            timeout=1200,
        )
        print(result.stdout)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "OK all dashboard steps passed" in result.stdout
    finally:
        warren.cli("template", "delete", BUILD_NAME, "--force")
        shutil.rmtree(context, ignore_errors=True)
        for sandbox in api.get("/v2/sandboxes", params={"metadata": "suite=wt-dashboard", "state": "running,paused"}).json():
            api.delete(f"/sandboxes/{sandbox['sandboxID']}")
        api.close()
