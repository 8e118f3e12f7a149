"""The monitor against a real `warren up` (issue 18, docs/operations.md): a `while true` loop is found
and killed by a sandbox's runaway policy while a calm process beside it lives on; `warren sandbox top`
and `kill-process` see and signal a sandbox's processes; the metrics series answers a time range
with the samples of that range, through REST and the SDK."""

import time

import httpx

from conftest import poll

# Bounds on waits, not speed assertions: generous for a loaded 2-core machine.
POLICY_WAIT_S = 90
SAMPLES_WAIT_S = 60


def _api(sdk_env):
    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": sdk_env["E2B_API_KEY"]}, timeout=120
    )



def _commands(processes, needle):
    return [p for p in processes if needle in p["command"]]


def test_a_runaway_loop_is_killed_by_policy_and_a_calm_process_lives(sdk_env, warren):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        refused = api.post(
            "/sandboxes",
            json={"templateID": "base", "policies": {"runaway": {"cpuPercent": -5}}},
        )
        assert refused.status_code == 400 and "cpuPercent" in refused.text, refused.text
        made = api.post(
            "/sandboxes",
            json={
                "templateID": "base",
                "timeout": 300,
                "metadata": {"suite": "wt-fleet"},
                "policies": {"runaway": {"cpuPercent": 50, "seconds": 3, "kill": True}},
            },
        )
        assert made.status_code == 201, made.text
        sandbox_id = made.json()["sandboxID"]
        try:
            sandbox = Sandbox.connect(sandbox_id)
            sandbox.commands.run("sleep 600 # wt-calm", background=True)
            sandbox.commands.run("sh -c 'while :; do :; done' # wt-spin", background=True)

            def processes():
                listed = api.get(f"/sandboxes/{sandbox_id}/processes")
                assert listed.status_code == 200, listed.text
                return listed.json()

            poll("the calm process to show", lambda: _commands(processes(), "sleep 600"), 30)
            poll("the loop to be killed", lambda: not _commands(processes(), "while :"), POLICY_WAIT_S)
            assert _commands(processes(), "sleep 600"), "the calm process was left alone"

            lines = _lifecycle_lines(api, sandbox_id)
            runaway = [line for line in lines if "runaway process" in line]
            assert len(runaway) == 1, lines
            assert "while :" in runaway[0] and "killed by the runaway policy" in runaway[0], runaway
            scraped = api.get("/metrics").text
            assert 'warren_policy_actions_total{policy="runaway_cpu",action="killed"}' in scraped
            updated = api.get(
                f"/events/sandboxes/{sandbox_id}", params={"types": "sandbox.lifecycle.updated"}
            ).json()
            assert [e["eventData"]["reason"] for e in updated] == [
                line.split(": ", 1)[1] for line in runaway
            ], updated

            # The CLI sees the same processes and signals one of them.
            top = warren.cli("sandbox", "top", sandbox_id)
            assert top.returncode == 0, top.stdout + top.stderr
            calm = [line for line in top.stdout.splitlines() if "sleep 600" in line]
            assert calm, top.stdout
            pid = calm[0].split()[0]
            sent = warren.cli("sandbox", "kill-process", sandbox_id, pid, "--signal", "TERM")
            assert sent.returncode == 0, sent.stdout + sent.stderr
            poll("the calm process to end on SIGTERM", lambda: not _commands(processes(), "sleep 600"), 30)
            gone = api.delete(f"/sandboxes/{sandbox_id}/processes/{pid}")
            assert gone.status_code == 404, gone.text
            init = api.delete(f"/sandboxes/{sandbox_id}/processes/1")
            assert init.status_code == 400 and "kill the sandbox" in init.text, init.text
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")


def test_metrics_range_returns_the_samples_of_that_range(sdk_env):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=300, metadata={"suite": "wt-fleet"})
    try:
        with _api(sdk_env) as api:
            url = f"/sandboxes/{sandbox.sandbox_id}/metrics"

            def series():
                samples = api.get(url).json()
                return samples if len(samples) >= 4 else None

            samples = poll("four samples", series, SAMPLES_WAIT_S)
            seconds = [s["timestampUnix"] for s in samples]
            assert seconds == sorted(seconds), seconds
            assert all(s["memTotal"] > 0 and s["diskTotal"] > 0 for s in samples), samples
            middle = seconds[len(seconds) // 2]
            ranged = api.get(url, params={"start": middle, "end": middle}).json()
            assert ranged and all(s["timestampUnix"] == middle for s in ranged), (middle, ranged)
            assert len(ranged) < len(samples)
            later = api.get(url, params={"start": middle + 1}).json()
            assert later and all(s["timestampUnix"] > middle for s in later), later
            backwards = api.get(url, params={"start": middle, "end": middle - 1})
            assert backwards.status_code == 400 and "after end" in backwards.text, backwards.text
            bad = api.get(url, params={"start": "yesterday"})
            assert bad.status_code == 400 and "start" in bad.text, bad.text

            many = api.get(
                "/sandboxes/metrics", params={"sandbox_ids": f"{sandbox.sandbox_id},wtnosuchsandbox"}
            ).json()
            assert list(many["sandboxes"]) == [sandbox.sandbox_id], many

            # Traffic to the sandbox (a command's request in, a megabyte of output out) is counted
            # on its link, and the page cache a written file fills is reported.
            before = samples[-1]
            sandbox.commands.run("head -c 1000000 /dev/zero | base64 -w 0 > /tmp/wt-out; cat /tmp/wt-out")

            def grown():
                last = api.get(url).json()[-1]
                return last if last["netTxBytes"] >= before["netTxBytes"] + 1_000_000 else None

            last = poll("the output counted as sent", grown, SAMPLES_WAIT_S)
            assert last["netRxBytes"] > before["netRxBytes"], (before, last)
            assert last["memCache"] > 0, last

        import datetime

        start = datetime.datetime.fromtimestamp(middle, tz=datetime.timezone.utc)
        through_sdk = sandbox.get_metrics(start=start, end=start)
        assert [int(m.timestamp.timestamp()) for m in through_sdk] == [middle] * len(ranged)
    finally:
        sandbox.kill()


def _create(api, policies):
    made = api.post(
        "/sandboxes",
        json={"templateID": "base", "timeout": 300, "metadata": {"suite": "wt-fleet"}, "policies": policies},
    )
    assert made.status_code == 201, made.text
    return made.json()["sandboxID"]


def _lifecycle_lines(api, sandbox_id):
    """The sandbox's log lines that are lifecycle events (not lines its commands printed)."""
    entries = api.get(f"/sandboxes/{sandbox_id}/logs").json()["logEntries"]
    return [entry["message"] for entry in entries if entry["fields"].get("event") == "lifecycle"]


def _event(api, sandbox_id, needle, bound_s=POLICY_WAIT_S):
    def found():
        return [line for line in _lifecycle_lines(api, sandbox_id) if needle in line]

    return poll(f"an event with {needle!r}", found, bound_s)


def test_memory_pressure_names_the_hog_and_an_oom_kill_is_an_event(sdk_env):
    from e2b import Sandbox
    from e2b import CommandExitException

    with _api(sdk_env) as api:
        refused = api.post("/sandboxes", json={"templateID": "base", "policies": {"memoryAlertPercent": 101}})
        assert refused.status_code == 400 and "memoryAlertPercent" in refused.text, refused.text
        sandbox_id = _create(api, {"memoryAlertPercent": 50})
        try:
            sandbox = Sandbox.connect(sandbox_id)
            # 320 MiB of the default 512 MiB, written so that it is resident.
            sandbox.commands.run(
                "python3 -c \"b = b'x' * (320 * 2**20); import time; time.sleep(600)\" # wt-hog",
                background=True,
            )
            pressure = _event(api, sandbox_id, "memory pressure")
            assert len(pressure) == 1, pressure
            assert "python3" in pressure[0] and "of 512 MiB in use" in pressure[0], pressure
            try:
                sandbox.commands.run("python3 -c \"b = b'y' * (900 * 2**20)\"", timeout=120)
                raise AssertionError("900 MiB fit under a 512 MiB limit")
            except CommandExitException as ended:
                assert ended.exit_code != 0
            oom = _event(api, sandbox_id, "out of memory")
            assert "OOM killer ended" in oom[0] and "512 MiB limit" in oom[0], oom
            scraped = api.get("/metrics").text
            assert 'policy="oom_kill",action="reported"' in scraped
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")


def test_a_filling_disk_names_its_largest_file(sdk_env, warren):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        sandbox_id = _create(api, {"diskAlertPercent": 30})
        try:
            sandbox = Sandbox.connect(sandbox_id)
            # A symlink to "/" would lead a host-side walk that follows it into the host's own files.
            sandbox.commands.run(
                "fallocate -l 800M /tmp/wt-big.bin && echo small > /tmp/wt-small.txt"
                " && ln -s / /tmp/wt-host-root && ln -s /etc /home/user/wt-etc"
            )
            full = _event(api, sandbox_id, "disk nearly full")
            assert len(full) == 1, full
            assert "largest files: /tmp/wt-big.bin (800 MiB)" in full[0], full

            du = warren.cli("sandbox", "du", sandbox_id, "-n", "3")
            assert du.returncode == 0, du.stdout + du.stderr
            rows = [line for line in du.stdout.splitlines() if line.strip().endswith(".bin") or "/tmp/" in line]
            assert rows and rows[0].split()[-1] == "/tmp/wt-big.bin", du.stdout
            usage = api.get(f"/sandboxes/{sandbox_id}/disk", params={"count": 2}).json()
            assert usage["usedBytes"] > 800 * 2**20 and usage["totalBytes"] > usage["usedBytes"], usage
            biggest = usage["largest"][0]
            assert biggest["path"] == "/tmp/wt-big.bin", usage
            # Allocated bytes: the file's blocks, and a few of the file system's own for its extents.
            assert 800 * 2**20 <= biggest["bytes"] < 801 * 2**20, usage
            assert [f["path"] for f in usage["largest"]] == ["/tmp/wt-big.bin", "/tmp/wt-small.txt"], usage
            every = api.get(f"/sandboxes/{sandbox_id}/disk", params={"count": 1000}).json()["largest"]
            paths = [f["path"] for f in every]
            assert not [p for p in paths if p.startswith(("/tmp/wt-host-root", "/home/user/wt-etc"))], paths
            listed = " ".join(f"'{p}'" for p in paths if "'" not in p)
            missing = sandbox.commands.run(
                f"for p in {listed}; do [ -f \"$p\" ] && [ ! -L \"$p\" ] || echo \"$p\"; done", user="root"
            ).stdout
            assert missing == "", f"listed but not a file of the sandbox: {missing}"
            bad = api.get(f"/sandboxes/{sandbox_id}/disk", params={"count": 0})
            assert bad.status_code == 400 and "count" in bad.text, bad.text
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")


def test_lifecycle_events_in_e2b_shape_for_the_team_only(sdk_env, warren):
    from e2b import Sandbox

    sandbox = Sandbox.create(template="base", timeout=300, metadata={"suite": "wt-fleet"})
    sandbox_id = sandbox.sandbox_id
    sandbox.pause()
    Sandbox.connect(sandbox_id, timeout=300)
    sandbox.kill()
    with _api(sdk_env) as api:
        own = api.get(f"/events/sandboxes/{sandbox_id}", params={"orderAsc": "true"}).json()
        assert [e["type"] for e in own] == [
            "sandbox.lifecycle.created",
            "sandbox.lifecycle.paused",
            "sandbox.lifecycle.resumed",
            "sandbox.lifecycle.killed",
        ], own
        first = own[0]
        assert first["version"] == "v1" and first["sandboxId"] == sandbox_id, first
        assert first["sandboxTemplateId"] and first["sandboxTeamId"], first
        ids = [int(e["id"]) for e in own]
        assert ids == sorted(ids), ids
        newest = api.get(f"/events/sandboxes/{sandbox_id}", params={"limit": 1}).json()
        assert [e["type"] for e in newest] == ["sandbox.lifecycle.killed"], newest
        after = api.get(f"/events/sandboxes/{sandbox_id}", params={"after": ids[1], "orderAsc": "true"}).json()
        assert [int(e["id"]) for e in after] == ids[2:], after
        killed = api.get("/events/sandboxes", params={"types": "sandbox.lifecycle.killed", "limit": 100}).json()
        assert sandbox_id in [e["sandboxId"] for e in killed], killed
        assert {e["type"] for e in killed} == {"sandbox.lifecycle.killed"}, killed
        for bad in ({"types": "sandbox.lifecycle.exploded"}, {"limit": 0}, {"orderAsc": "maybe"}):
            refused = api.get("/events/sandboxes", params=bad)
            assert refused.status_code == 400, (bad, refused.text)

        team = f"wt-events-{sandbox_id[:6]}"
        assert api.post("/teams", json={"name": team}).status_code == 201
        other_key = api.post("/api-keys", json={"name": "events", "teamID": team}).json()["key"]
    with httpx.Client(base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": other_key}, timeout=60) as other:
        assert other.get(f"/events/sandboxes/{sandbox_id}").status_code == 404
        theirs = other.get("/events/sandboxes", params={"limit": 100}).json()
        assert sandbox_id not in [e["sandboxId"] for e in theirs], theirs

    printed = warren.cli("events", "--sandbox", sandbox_id)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    kinds = [line.split()[2] for line in printed.stdout.splitlines()]
    assert kinds == ["created", "paused", "resumed", "killed"], printed.stdout


def _state(api, sandbox_id):
    got = api.get(f"/sandboxes/{sandbox_id}")
    return got.json()["state"] if got.status_code == 200 else f"gone ({got.status_code})"


def test_the_idle_policy_ends_a_sandbox_only_once_nothing_uses_it(sdk_env):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        sandbox_id = _create(api, {"idleTimeoutSecs": 3})
        paused_id = None
        try:
            sandbox = Sandbox.connect(sandbox_id)
            # A command streaming for longer than the idle timeout is use.
            assert sandbox.commands.run("sleep 6 && echo done", timeout=60).stdout == "done\n"
            # So is a command still running after its client went away.
            handle = sandbox.commands.run("sleep 8", background=True)
            handle.disconnect()
            time.sleep(6)
            assert _state(api, sandbox_id) == "running"
            poll("the idle sandbox to be killed", lambda: _state(api, sandbox_id) != "running", POLICY_WAIT_S)
            killed = api.get(f"/events/sandboxes/{sandbox_id}", params={"limit": 1}).json()[0]
            assert killed["type"] == "sandbox.lifecycle.killed", killed
            assert "idle for 3 s" in killed["eventData"]["reason"], killed

            made = api.post(
                "/sandboxes",
                json={"templateID": "base", "timeout": 300, "autoPause": True, "policies": {"idleTimeoutSecs": 2}},
            )
            assert made.status_code == 201, made.text
            paused_id = made.json()["sandboxID"]
            poll("the idle auto-pause sandbox to pause", lambda: _state(api, paused_id) == "paused", POLICY_WAIT_S)
            resumed = Sandbox.connect(paused_id, timeout=300)
            assert resumed.commands.run("echo back").stdout == "back\n"
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")
            if paused_id:
                api.delete(f"/sandboxes/{paused_id}")


ORPHANS = (
    "for i in 1 2 3; do (exec -a orphan-worker sleep 600 >/dev/null 2>&1 &); done; echo started"
)


def test_orphans_left_by_a_finished_command_are_listed_and_reaped_on_resume(sdk_env, warren):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        sandbox_id = _create(api, {"reapOrphansOnResume": True})
        try:
            sandbox = Sandbox.connect(sandbox_id)
            kept = sandbox.commands.run("sleep 600 # wt-kept", background=True)
            assert sandbox.commands.run(ORPHANS).stdout == "started\n"

            def orphans():
                listed = api.get(f"/sandboxes/{sandbox_id}/orphans")
                assert listed.status_code == 200, listed.text
                return listed.json()

            found = poll("three orphans", lambda: len(orphans()) == 3 and orphans(), 30)
            assert all(p["command"].startswith("orphan-worker") and p["ppid"] == 1 for p in found), found
            listed = warren.cli("sandbox", "orphans", sandbox_id)
            assert listed.returncode == 0 and listed.stdout.count("orphan-worker") == 3, listed.stdout

            sandbox.pause()
            Sandbox.connect(sandbox_id, timeout=300)
            assert orphans() == [], "reaped on resume"
            processes = api.get(f"/sandboxes/{sandbox_id}/processes").json()
            assert kept.pid in [p["pid"] for p in processes], "the agent's own background command lives on"
            assert not _commands(processes, "orphan-worker"), processes
            reaped = _event(api, sandbox_id, "reaped 3 orphaned process(es) (on resume)")
            assert reaped[0].count("orphan-worker") == 3, reaped

            assert sandbox.commands.run(ORPHANS).stdout == "started\n"
            poll("new orphans", lambda: len(orphans()) == 3, 30)
            killed = warren.cli("sandbox", "orphans", sandbox_id, "--kill")
            assert killed.returncode == 0 and "killed 3 orphaned process(es)" in killed.stdout, killed.stdout
            assert orphans() == []
            kept.kill()
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")


def test_orphans_are_reaped_on_the_sandboxs_schedule(sdk_env):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        refused = api.post("/sandboxes", json={"templateID": "base", "policies": {"reapOrphansEverySecs": -1}})
        assert refused.status_code == 400 and "reapOrphansEverySecs" in refused.text, refused.text
        sandbox_id = _create(api, {"reapOrphansEverySecs": 2})
        try:
            sandbox = Sandbox.connect(sandbox_id)
            kept = sandbox.commands.run("sleep 600 # wt-kept", background=True)
            assert sandbox.commands.run(ORPHANS).stdout == "started\n"
            reaped = _event(api, sandbox_id, "orphaned process(es) (on schedule)")
            assert "orphan-worker" in reaped[0], reaped
            poll(
                "no orphan left",
                lambda: not _commands(api.get(f"/sandboxes/{sandbox_id}/processes").json(), "orphan-worker"),
                30,
            )
            processes = api.get(f"/sandboxes/{sandbox_id}/processes").json()
            assert kept.pid in [p["pid"] for p in processes], "the agent's own background command lives on"
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")
