"""Sandbox logs against a real `warren up` (issue 18, docs/operations.md "Sandbox logs"): what a
command printed comes back through `/v2/sandboxes/{id}/logs` (read with the SDK's own generated
client) and `/sandboxes/{id}/logs`, paged by cursor both ways, filtered by level and text; it stays
readable while the sandbox is paused and after it is killed, the last line printed before the kill
included; a fork's log does not carry its parent's lines; `warren sandbox logs` prints the tail."""

import sys

import httpx
import pytest

from conftest import poll

LINES = 30


def _api(sdk_env):
    return httpx.Client(
        base_url=sdk_env["E2B_API_URL"], headers={"X-API-Key": sdk_env["E2B_API_KEY"]}, timeout=120
    )


def _v2(api, sandbox_id, **params):
    answer = api.get(f"/v2/sandboxes/{sandbox_id}/logs", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()["logs"]


def _printed(api, sandbox_id, needle, **params):
    """The lines with `needle` the sandbox's commands printed (not the start lines naming them)."""
    entries = _v2(api, sandbox_id, search=needle, **params)
    return [e["message"] for e in entries if "stream" in e["fields"]]


def test_a_commands_output_is_logged_paged_filtered_and_outlives_the_sandbox(sdk_env, warren):
    from e2b import CommandExitException, Sandbox
    from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs as v2_logs
    from e2b.api.client.models import LogLevel, LogsDirection
    from e2b.api.client_sync import get_api_client
    from e2b.connection_config import ConnectionConfig

    sandbox = Sandbox.create(timeout=300, metadata={"suite": "wt-logs"})
    killed = False
    try:
        # Lines a few milliseconds apart, so a cursor (milliseconds) pages them exactly.
        script = f"for i in $(seq 1 {LINES}); do echo wt-line-$i; sleep 0.01; done; echo wt-err >&2; exit 3"
        try:
            sandbox.commands.run(script)
            raise AssertionError("the command's exit 3 was not reported")
        except CommandExitException as ended:
            assert ended.exit_code == 3

        with _api(sdk_env) as api:
            expected = [f"wt-line-{i}" for i in range(1, LINES + 1)]
            entries = _v2(api, sandbox.sandbox_id, search="wt-line-")
            # The command's own start line names it too; the output lines are the stdout ones.
            output = [e for e in entries if e["fields"].get("stream") == "stdout"]
            assert [e["message"] for e in output] == expected, entries
            assert all(e["level"] == "info" for e in output)
            pid = output[0]["fields"]["pid"]
            assert all(e["fields"]["pid"] == pid for e in output)

            # Forward pages of ten, each from just after the last one's time.
            pages, cursor = [], 0
            while True:
                page = _v2(api, sandbox.sandbox_id, search="wt-line-", cursor=cursor, limit=10)
                page = [e for e in page if e["fields"].get("stream") == "stdout"]
                if not page:
                    break
                pages.append([e["message"] for e in page])
                cursor = _millis(page[-1]["timestamp"]) + 1
            assert sum(pages, []) == expected, pages
            assert all(len(p) <= 10 for p in pages) and len(pages) >= 3, pages

            # Backward from now: the newest first.
            newest = _v2(api, sandbox.sandbox_id, search="wt-line-", direction="backward", limit=1)
            assert [e["message"] for e in newest] == [f"wt-line-{LINES}"], newest

            # warn and above: the stderr line and the failed end, no stdout.
            severe = _v2(api, sandbox.sandbox_id, level="warn")
            messages = [e["message"] for e in severe]
            assert "wt-err" in messages, messages
            ended = [e for e in severe if e["fields"].get("event") == "process_end"]
            assert ended and ended[0]["level"] == "error" and "exit status 3" in ended[0]["message"]
            assert not any(m.startswith("wt-line-") for m in messages), messages

            # The SDK's generated client reads the same page into its own models.
            config = ConnectionConfig(api_key=sdk_env["E2B_API_KEY"], api_url=sdk_env["E2B_API_URL"])
            parsed = v2_logs.sync(
                sandbox.sandbox_id,
                client=get_api_client(config),
                search="wt-line-2",
                level=LogLevel.INFO,
                direction=LogsDirection.FORWARD,
            )
            assert [e.message for e in parsed.logs if e.fields["stream"] == "stdout"] == [
                "wt-line-2",
                *[f"wt-line-{i}" for i in range(20, 30)],
            ], parsed

            # The v1 shape: lines and entries, lifecycle events among them.
            v1 = api.get(f"/sandboxes/{sandbox.sandbox_id}/logs", params={"limit": 5000}).json()
            assert [entry["line"] for entry in v1["logs"]] == [e["message"] for e in v1["logEntries"]]
            assert any(e["fields"].get("event") == "lifecycle" for e in v1["logEntries"]), v1

            # Bad input is refused, naming what is wrong.
            for params, named in [
                ({"level": "loud"}, "level"),
                ({"direction": "sideways"}, "direction"),
                ({"cursor": "yesterday"}, "cursor"),
                ({"limit": "-1"}, "limit"),
                ({"tail": "5"}, "tail"),
            ]:
                refused = api.get(f"/v2/sandboxes/{sandbox.sandbox_id}/logs", params=params)
                assert refused.status_code == 400 and named in refused.text, (params, refused.text)

            # `warren sandbox logs -n 2` prints the last two matching lines.
            tail = warren.cli("sandbox", "logs", sandbox.sandbox_id, "--search", "wt-line-", "-n", "2")
            assert tail.returncode == 0, tail.stdout + tail.stderr
            shown = [line.split()[-1] for line in tail.stdout.splitlines()]
            assert shown == [f"wt-line-{LINES - 1}", f"wt-line-{LINES}"], tail.stdout

            # Paused, the log is still there; resumed, new lines join it.
            sandbox.beta_pause()
            assert _printed(api, sandbox.sandbox_id, "wt-err") == ["wt-err"]
            sandbox = Sandbox.connect(sandbox.sandbox_id, timeout=300)
            sandbox.commands.run("echo wt-after-resume")
            poll("the line printed after resume", lambda: _printed(api, sandbox.sandbox_id, "wt-after-resume"), 30)

            # Printed just before the kill (no monitor pass in between) and still readable after it.
            sandbox.commands.run("echo wt-last-words")
            sandbox.kill()
            killed = True
            assert _printed(api, sandbox.sandbox_id, "wt-last-words") == ["wt-last-words"]
            gone = api.get(f"/sandboxes/{sandbox.sandbox_id}")
            assert gone.status_code == 404, gone.text
    finally:
        if not killed:
            sandbox.kill()


def _millis(rfc3339):
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def test_a_fork_starts_its_own_log_and_other_teams_see_none(sdk_env):
    from e2b import Sandbox

    with _api(sdk_env) as api:
        if not api.get("/health").json().get("checkpoint"):
            reason = "this host cannot take CRIU checkpoints (/health: checkpoint=false); forks need them"
            sys.__stderr__.write(f"SKIP: {reason}\n")
            pytest.skip(reason)
    parent = Sandbox.create(timeout=300, metadata={"suite": "wt-logs"})
    child_id = None
    try:
        parent.commands.run("echo wt-parent-line")
        with _api(sdk_env) as api:
            forked = api.post(f"/sandboxes/{parent.sandbox_id}/fork", json={"count": 1})
            assert forked.status_code == 201, forked.text
            child_id = forked.json()[0]["sandbox"]["sandboxID"]
            child = Sandbox.connect(child_id)
            child.commands.run("echo wt-child-line")
            assert _printed(api, child_id, "wt-child-line") == ["wt-child-line"]
            assert _printed(api, child_id, "wt-parent-line") == [], "the fork carried its parent's log"
            assert _printed(api, parent.sandbox_id, "wt-parent-line") == ["wt-parent-line"]
            assert _printed(api, parent.sandbox_id, "wt-child-line") == []

            team = f"wt-logs-{parent.sandbox_id[:6]}"
            assert api.post("/teams", json={"name": team}).status_code == 201
            key = api.post("/api-keys", json={"name": "logs", "teamID": team}).json()["key"]
            stranger = api.get(f"/v2/sandboxes/{parent.sandbox_id}/logs", headers={"X-API-Key": key})
            assert stranger.status_code == 404, stranger.text
    finally:
        parent.kill()
        if child_id:
            with _api(sdk_env) as api:
                api.delete(f"/sandboxes/{child_id}")
