"""The official e2b JS SDK (pinned in js/package.json) against the agent, when Node is here."""

import pathlib
import shutil
import subprocess

JS = pathlib.Path(__file__).resolve().parent / "js"


def test_js_sdk_smoke(shared_agent):
    if shutil.which("node") is None or not (JS / "node_modules" / "e2b").is_dir():
        print("SKIP: node or tests/sdk/js/node_modules missing (scripts/setup.d/26-js-sdk.sh installs it)")
        return
    done = subprocess.run(
        ["node", str(JS / "smoke.mjs"), shared_agent.url],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "all checks passed" in done.stdout
