"""Several SDK template builds started at once (issue 17): each finishes (ready) or fails naming its
step; none stays `building`. Each template runs real commands in a build sandbox (whoami, a sleep,
a start command with a ready check), so build sandboxes come and go on reused addresses while the
others are mid-step, which is what left builds hanging."""

import threading

BUILDS = 5


def test_five_sdk_builds_at_once_all_finish(sdk_env):
    from e2b import Sandbox, Template

    results, errors = {}, {}

    def build(n):
        template = (
            Template()
            .from_image("debian:bookworm")
            .run_cmd('test "$(whoami)" = "root"', user="root")
            .run_cmd(f"sleep 2 && echo build-{n} > /tmp/which")
            .set_start_cmd(f"sleep 1; echo started-{n} > /tmp/started; sleep infinity", "test -f /tmp/started")
        )
        try:
            results[n] = Template.build(template, alias=f"wt-e2e-concurrent-{n}")
        except Exception as error:  # noqa: BLE001 - recorded and asserted below
            errors[n] = error

    threads = [threading.Thread(target=build, args=(n,)) for n in range(BUILDS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        # A bound on the wait, not a speed assertion: a hung build never ends at all.
        thread.join(timeout=1200)
    assert not any(thread.is_alive() for thread in threads), "a build never finished"
    assert not errors, errors
    assert sorted(results) == list(range(BUILDS))
    sandbox = Sandbox.create(template="wt-e2e-concurrent-3", timeout=120)
    try:
        assert sandbox.commands.run("cat /tmp/which").stdout == "build-3\n"
    finally:
        sandbox.kill()


def test_five_fixture_builds_at_once_all_finish(warren, tmp_path):
    """The http-app fixture (COPY, an offline pip install, start_cmd + ready_cmd over HTTP) built five
    times at once under different names with `warren template build`."""
    import glob
    import shutil
    import subprocess
    from pathlib import Path

    wheels = glob.glob("/usr/share/python-wheels/pip-*.whl")
    if not wheels:
        print("SKIP: no pip wheel on the host (python3-pip-whl) for the fixture's offline install")
        return
    fixture = Path(__file__).resolve().parents[2] / "tests" / "templates" / "http-app"
    procs = []
    for n in range(BUILDS):
        context = tmp_path / f"app-{n}"
        shutil.copytree(fixture, context)
        shutil.copy(wheels[0], context / "wheels")
        # Different content from the first COPY on, so no build is served from another's cache (nor
        # leaves cached layers that would change what test_templates_e2e.py's cold build streams).
        (context / "wheels" / f"which-{n}.txt").write_text(f"{n}\n")
        procs.append(
            subprocess.Popen(
                [warren.binary, "template", "build", str(context), "--name", f"wt-e2e-fixture-{n}"],
                env={**__import__("os").environ, **warren.env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=1200)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out = "TIMED OUT (the build never ended)\n" + out
        outputs.append((proc.returncode, out))
    failed = [f"build {n} exited {code}:\n{out}" for n, (code, out) in enumerate(outputs) if code != 0]
    assert not failed, "\n\n".join(failed)
