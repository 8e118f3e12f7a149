"""Template builds end to end against a real `warren up`: `warren template build` on the http-app
fixture (COPY context upload, offline pip install in a real sandbox, start_cmd + ready_cmd), a second
build served from the layer cache, a sandbox from the template through the official SDK whose HTTP
server answers through the sandbox proxy, a failing build's output and exit code, and delete (409
while in use, then --force)."""

import glob
import json
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FIXTURE = REPO / "tests" / "templates" / "http-app"
# The fixture's offline `pip install` runs pip from the host's wheel (Debian's python3-pip-whl).
HOST_PIP_WHEELS = "/usr/share/python-wheels/pip-*.whl"
NAME = "wt-e2e-http-app"
GREETING = "hello from a pip-installed package"
# `warren template build` exits 5 for a refused (409) request, 1 for a failed build.
EXIT_REFUSED = 5
EXIT_ERROR = 1


def _build(warren, *args):
    started = time.monotonic()
    result = warren.cli("template", "build", *args, timeout=900)
    return result, time.monotonic() - started


def _fixture_copy(into: str) -> str | None:
    """The http-app fixture with the host's pip wheel added to wheels/ (as its README says)."""
    wheels = glob.glob(HOST_PIP_WHEELS)
    if not wheels:
        return None
    context = Path(into) / "http-app"
    shutil.copytree(FIXTURE, context)
    shutil.copy(wheels[0], context / "wheels")
    return str(context)


def test_build_cache_sandbox_and_delete(warren, sdk_env, tmp_path):
    from e2b import Sandbox

    context = _fixture_copy(str(tmp_path))
    if context is None:
        print(f"SKIP: no pip wheel at {HOST_PIP_WHEELS} (install python3-pip-whl; scripts/setup does)")
        return
    cold, cold_s = _build(warren, context, "--name", NAME)
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert GREETING in cold.stdout, cold.stdout  # the RUN step's output is streamed
    assert "notes.tmp" not in cold.stdout  # .dockerignore applies to the uploaded context
    summary = re.search(r"ready in [0-9.]+s \((\d+) of (\d+) steps cached\)", cold.stdout)
    assert summary, cold.stdout
    assert summary.group(1) == "0", cold.stdout
    # The build's sandboxes have no sandbox records, but they left lifecycle events naming the build.
    events_request = urllib.request.Request(
        sdk_env["E2B_API_URL"] + "/events/sandboxes?limit=100",
        headers={"X-API-Key": sdk_env["E2B_API_KEY"]},
    )
    with urllib.request.urlopen(events_request, timeout=30) as response:
        events = json.loads(response.read())
    built = [e for e in events if e["sandboxBuildId"] and e["sandboxId"].startswith("bld-")]
    by_build = {}
    for event in built:
        by_build.setdefault(event["sandboxBuildId"], set()).add(event["type"])
    wanted = {"sandbox.lifecycle.created", "sandbox.lifecycle.killed"}
    assert any(wanted <= kinds for kinds in by_build.values()), events

    cached, cached_s = _build(warren, context, "--name", NAME)
    assert cached.returncode == 0, cached.stdout + cached.stderr
    assert "CACHED" in cached.stdout, cached.stdout
    summary = re.search(r"\((\d+) of (\d+) steps cached\)", cached.stdout)
    assert summary and summary.group(1) == summary.group(2), cached.stdout
    print(f"\nTIMING template build http-app: cold {cold_s:.1f}s, cached {cached_s:.1f}s")

    listed = warren.cli("template", "list")
    assert NAME in listed.stdout and "ready" in listed.stdout, listed.stdout

    sandbox = Sandbox.create(template=NAME, timeout=300, metadata={"suite": "wt-e2e-templates"})
    try:
        # start_cmd ran and ready_cmd passed at create: the server answers through the proxy.
        request = urllib.request.Request(
            sdk_env["E2B_SANDBOX_URL"] + "/",
            headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            assert response.read().decode() == GREETING
        assert sandbox.get_host(8000).startswith("8000-" + sandbox.sandbox_id)
        # The layers are the template's: its files are there.
        result = sandbox.commands.run("ls /home/user/app")
        assert "server.py" in result.stdout.split(), result.stdout
        # As `docker exec` in a container of the image: the Dockerfile's ENV and final WORKDIR are
        # where commands start (a command's own env and cwd still win).
        result = sandbox.commands.run('echo "$APP_DIR $PYTHONUNBUFFERED"; pwd')
        assert result.stdout == "/home/user/app 1\n/home/user/app\n", result.stdout
        result = sandbox.commands.run("echo $APP_DIR; pwd", cwd="/tmp", envs={"APP_DIR": "mine"})
        assert result.stdout == "mine\n/tmp\n", result.stdout

        refused = warren.cli("template", "delete", NAME)
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        assert "force" in refused.stderr, refused.stderr
    finally:
        sandbox.kill()
    deleted = warren.cli("template", "delete", NAME, "--force")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert NAME not in warren.cli("template", "list").stdout


def test_failing_step_shows_its_output_and_exits_non_zero(warren):
    with tempfile.TemporaryDirectory(prefix="wt-e2e-failing-") as context:
        Path(context, "e2b.Dockerfile").write_text(
            "FROM debian:bookworm\nRUN echo wt-output-before-failure && exit 3\n"
        )
        result, _ = _build(warren, context, "--name", "wt-e2e-failing")
    assert result.returncode == EXIT_ERROR, result.stdout + result.stderr
    assert "wt-output-before-failure" in result.stdout + result.stderr
    assert "failed" in result.stderr, result.stderr
    warren.cli("template", "delete", "wt-e2e-failing", "--force")


def test_official_sdk_template_builder(sdk_env, tmp_path):
    """The SDK's Template builder: v3 request, file upload link + PUT, v2 start, status polling."""
    from e2b import Sandbox, Template

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('from-sdk-copy')\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image("debian:bookworm")
        .copy("app", "/home/user/app")
        .run_cmd("python3 /home/user/app/main.py > /home/user/out.txt")
    )
    logs = []
    first = Template.build(template, alias="wt-e2e-sdk-built", on_build_logs=lambda e: logs.append(e.message))
    assert any("0 of 2 steps cached" in line for line in logs), logs
    logs.clear()
    second = Template.build(template, alias="wt-e2e-sdk-built", on_build_logs=lambda e: logs.append(e.message))
    assert second.template_id == first.template_id and second.build_id != first.build_id
    assert any("already cached" in line for line in logs), logs  # the upload was skipped
    assert any("2 of 2 steps cached" in line for line in logs), logs
    sandbox = Sandbox.create(template="wt-e2e-sdk-built", timeout=120)
    try:
        assert sandbox.commands.run("cat /home/user/out.txt").stdout == "from-sdk-copy\n"
    finally:
        sandbox.kill()


MULTI_STAGE = """\
FROM debian:bookworm AS build
RUN mkdir -p /out/sub && echo built-in-stage > /out/artifact && echo nested > /out/sub/file \\
    && ln -s /etc/hostname /out/host-link && rm -f /out/sub/file && echo kept > /out/sub/kept \\
    && echo stage-sentinel > /etc/wt-stage-sentinel && ln -s /etc /leak
FROM debian:bookworm AS unused
RUN exit 7
FROM debian:bookworm
COPY --from=build /out/ /opt/result/
COPY --from=build /leak/wt-stage-sentinel /opt/sentinel
"""


def test_multi_stage_dockerfile_copies_out_of_a_stage(warren, sdk_env):
    """A multi-stage e2b.Dockerfile: the template has what `COPY --from` took out of the build stage
    (a deleted file stays deleted, a link stays a link, a path through a symlink is the stage's), and
    a stage nothing uses is never built (its RUN would fail the build)."""
    from e2b import Sandbox

    with tempfile.TemporaryDirectory(prefix="wt-e2e-multistage-") as context:
        Path(context, "e2b.Dockerfile").write_text(MULTI_STAGE)
        result, _ = _build(warren, context, "--name", "wt-e2e-multistage")
    assert result.returncode == 0, result.stdout + result.stderr
    sandbox = Sandbox.create(template="wt-e2e-multistage", timeout=120)
    try:
        out = sandbox.commands.run(
            "cat /opt/result/artifact /opt/result/sub/kept /opt/sentinel; readlink /opt/result/host-link; "
            "test ! -e /opt/result/sub/file && test ! -e /etc/wt-stage-sentinel && echo clean"
        ).stdout
        assert out == "built-in-stage\nkept\nstage-sentinel\n/etc/hostname\nclean\n", out
    finally:
        sandbox.kill()
    warren.cli("template", "delete", "wt-e2e-multistage", "--force")
