"""A build stuck in a step never stays `building` (issue 17): `DELETE /templates/{id}/builds/{buildID}`
stops it while its step runs, the build fails as cancelled naming that step, and its build sandbox is
gone. The SDK starts and watches the build; the cancel is Warren's own endpoint (E2B has none)."""

import urllib.error
import urllib.request
from pathlib import Path

from conftest import poll

# Bounds on waits, not speed assertions: generous for a loaded 2-core machine.
STEP_START_WAIT_S = 300
SETTLE_WAIT_S = 120



def test_cancel_stops_a_running_step_and_fails_the_build_naming_it(warren, sdk_env):
    from e2b import Template

    template = (
        Template()
        .from_image("debian:bookworm")
        .run_cmd("echo wt-cancel-running && sleep 600")
        .run_cmd("echo never-reached")
    )
    info = Template.build_in_background(template, alias="wt-e2e-cancel")

    def running_step():
        status = Template.get_build_status(info)
        assert status.status.value in ("waiting", "building"), (status.status, status.reason and status.reason.message)
        return any("wt-cancel-running" in entry.message for entry in status.log_entries)

    poll("the sleeping step to start", running_step, STEP_START_WAIT_S)
    short = "".join(c for c in info.build_id if c.isalnum())[:12]
    sandboxes = Path(warren.state_dir) / "sandboxes"
    build_sandboxes = lambda: [p.name for p in sandboxes.iterdir() if p.name.startswith(f"bld-{short}")]  # noqa: E731
    assert build_sandboxes(), "the step runs in a build sandbox of this build"

    request = urllib.request.Request(
        f"{sdk_env['E2B_API_URL']}/templates/{info.template_id}/builds/{info.build_id}",
        method="DELETE",
        headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 204

    def ended():
        status = Template.get_build_status(info)
        return status if status.status.value not in ("waiting", "building") else None

    status = poll("the cancelled build to end", ended, SETTLE_WAIT_S)
    assert status.status.value == "error", status
    assert status.reason is not None and "cancelled" in status.reason.message, status.reason
    assert status.reason.step, f"the reason names no step: {status.reason}"
    assert not any("never-reached" in entry.message for entry in status.log_entries)
    poll("the build sandbox to be destroyed", lambda: not build_sandboxes(), SETTLE_WAIT_S)
    # Cancelling an ended build changes nothing and says so.
    try:
        urllib.request.urlopen(request, timeout=60)
        raise AssertionError("a second cancel of an ended build succeeded")
    except urllib.error.HTTPError as refused:
        assert refused.code == 409, refused.code
    assert Template.get_build_status(info).status.value == "error"
