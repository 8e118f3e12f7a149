"""`warren lab`: a scripted player solves every level of the course through the CLI, the REST API,
the official SDK and the app's pages (HTTP; level 1 in headless Chromium at the URL `start` printed),
against a real `warren up` (docs/lab.md).

Before each level's task the judge (`warren lab check N`) must say "not yet", so no level passes
without its task; a wrong flag is refused by the page; `status` checks the flags against the host's
secret; `reset` and `stop` leave a fresh lab and then nothing behind.
"""

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

from conftest import poll, REPO

DASHBOARD = REPO / "dashboard"
CHROMIUM = os.environ.get("WARREN_CHROMIUM", "/usr/bin/chromium")


def _no_browser() -> str | None:
    if not os.path.isfile(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/setup does)"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (DASHBOARD / "node_modules" / "playwright-core").is_dir():
        return "dashboard/node_modules missing (run scripts/setup)"
    return None


def in_chromium(url: str, phase: str) -> None:
    """Level 1 in headless Chromium at the printed URL (dashboard/tests/lab-level.mjs)."""
    result = subprocess.run(
        ["node", "tests/lab-level.mjs"], cwd=DASHBOARD, capture_output=True, text=True, timeout=300,
        env={**os.environ, "LAB_URL": url, "PHASE": phase, "CHROMIUM": CHROMIUM})
    print(result.stdout)
    assert result.returncode == 0 and "OK lab level in chromium" in result.stdout, (
        result.stdout + result.stderr)

class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


OPENER = urllib.request.build_opener(NoRedirect)


class Player:
    def __init__(self, warren, lab_file):
        self.warren = warren
        self.env = {"WARREN_LAB_FILE": str(lab_file)}
        self.sandbox_id = None

    def cli(self, *args, ok=True):
        result = self.warren.cli(*args, env=self.env)
        if ok:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    def api(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.warren.api_url + path, data=data, method=method,
            headers={"X-API-Key": self.warren.env["E2B_API_KEY"], "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            text = response.read()
        return json.loads(text) if text else None

    def app(self, path, form=None, sandbox_id=None):
        """A request to the lab app (or a fork's) through the proxy: (status, body text)."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(
            self.warren.env["E2B_SANDBOX_URL"] + path, data=data,
            headers={"E2b-Sandbox-Id": sandbox_id or self.sandbox_id, "E2b-Sandbox-Port": "8080"})
        try:
            with OPENER.open(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def check(self, level, answer=None):
        args = ["lab", "check", str(level), "--json"] + (["--answer", answer] if answer else [])
        result = self.cli(*args, ok=False)
        verdict = json.loads(result.stdout)
        assert (result.returncode == 0) == (verdict["flag"] is not None), (result.stdout, result.stderr)
        return verdict

    def not_yet(self, level, answer=None):
        verdict = self.check(level, answer)
        assert verdict["state"] == "not yet" and verdict["flag"] is None, verdict
        return verdict["message"]

    def open_level(self, level):
        status, body = self.app(f"/level/{level}")
        assert status == 200 and f"Level {level}:" in body, body
        return body

    def solve(self, level, answer=None):
        """The judge passes the level; its flag shows on the page and unlocks the next level."""
        verdict = self.check(level, answer)
        assert verdict["state"] in ("solved", "skipped"), verdict
        flag = verdict["flag"]
        status, body = self.app(f"/level/{level}")
        assert flag in body, "the revealed flag is on the level's page"
        status, _ = self.app(f"/level/{level}/flag", form={"flag": flag})
        assert status == 303, "the right flag unlocks the next level"
        return verdict

    def processes(self):
        return self.api("GET", f"/sandboxes/{self.sandbox_id}/processes")

    def observe(self, level):
        status, body = self.app(f"/api/observe/{level}")
        assert status == 200, body
        return json.loads(body)


def test_a_player_solves_every_level(warren, sdk_env, tmp_path):
    player = Player(warren, tmp_path / "lab.json")
    started = json.loads(player.cli("lab", "start", "--json").stdout)
    player.sandbox_id = sid = started["sandboxID"]
    assert started["url"].startswith("http://8080-" + sid + "."), started
    lab_id = started["labID"]
    status, index = player.app("/")
    assert status == 200 and "Level 12" in index
    status, course = player.app("/course")
    assert status == 200 and "warren lab" in course

    # Level 1. A locked level is neither checked nor accepted; a wrong flag and a wrong answer fail.
    assert "locked" in player.not_yet(2)
    status, _ = player.app("/level/2/flag", form={"flag": "WARREN{0}"})
    assert status == 403
    player.open_level(1)
    status, body = player.app("/level/1/flag", form={"flag": "WARREN{00000000000000000000000000000000}"})
    assert status == 400 and "Wrong flag" in body
    player.not_yet(1)
    player.not_yet(1, "not-the-id")
    no_browser = _no_browser()
    if no_browser:
        print(f"SKIP: level 1 in a browser: {no_browser}")
        player.solve(1, sid)
    else:
        # Level 1 as a player plays it: in a browser at the URL `start` printed (Host routing
        # through the proxy), a wrong flag refused, the judge's flag typed in and accepted.
        in_chromium(started["url"], "wrong")
        assert player.check(1, sid)["state"] == "solved"
        in_chromium(started["url"], "solve")

    # Level 2: the spinner, found with top and killed with kill-process. (The browser landed on
    # level 2's page, which sets the level up; without it, the judge first asks for the page.)
    if no_browser:
        assert "open the level" in player.not_yet(2)
    player.open_level(2)
    spinner = poll("the spinner in the process list",
                   lambda: [p for p in player.processes() if p["command"].startswith("lab-spinner")], 30)
    player.not_yet(2)
    player.cli("sandbox", "kill-process", sid, str(spinner[0]["pid"]))
    player.solve(2)

    # Level 3: the memory hog.
    player.open_level(3)
    hog = poll("the hog in the process list",
               lambda: [p for p in player.processes() if p["command"].startswith("lab-hog")], 30)
    player.not_yet(3)
    player.cli("sandbox", "kill-process", sid, str(hog[0]["pid"]))
    player.solve(3)

    # Level 4: the 512 MiB file, found with du and removed with exec.
    player.open_level(4)
    usage = player.api("GET", f"/sandboxes/{sid}/disk?count=10")
    blob = [f for f in usage["largest"] if f["path"].startswith("/tmp/.cache-lab/")][0]
    assert blob["bytes"] >= 512 << 20
    player.not_yet(4)
    player.cli("sandbox", "exec", sid, "--", "rm", "-f", blob["path"])
    player.solve(4)

    # Level 5: a long timeout while the task runs, a short one once it is done.
    player.open_level(5)
    assert "two hours" in player.not_yet(5)
    player.cli("sandbox", "timeout", sid, "7300")
    assert "step 1 of 2" in player.not_yet(5)
    poll("the level-5 task to end", lambda: player.observe(5)["running"] is False, 120)
    assert "still ends in" in player.not_yet(5)
    player.cli("sandbox", "timeout", sid, "600")
    player.solve(5)
    player.cli("sandbox", "timeout", sid, "3600")

    # Level 6: pause and resume keep the app's memory.
    player.open_level(6)
    player.not_yet(6)
    player.cli("sandbox", "pause", sid)
    player.cli("sandbox", "resume", sid, "--timeout", "3600")
    player.solve(6)

    # Level 7: orphans, listed and killed.
    player.open_level(7)
    poll("the orphans", lambda: json.loads(player.cli("sandbox", "orphans", sid, "--json").stdout), 30)
    player.not_yet(7)
    player.cli("sandbox", "orphans", sid, "--kill")
    player.solve(7)

    # Level 8: five forks, each with its own result.
    player.open_level(8)
    if player.api("GET", "/health")["checkpoint"]:
        player.not_yet(8, "fork-0,fork-1")
        # As many rounds as the host has room for: a full disk admits fewer forks at once.
        results = []
        while len(results) < 5:
            forks = player.api("POST", f"/sandboxes/{sid}/fork", {"count": 5 - len(results), "timeout": 300})
            fork_ids = [f["sandbox"]["sandboxID"] for f in forks if "sandbox" in f]
            assert fork_ids, forks
            for fork in fork_ids:
                status, body = player.app("/api/fork-result", sandbox_id=fork)
                assert status == 200, body
                results.append(json.loads(body)["result"])
            if len(results) < 5:
                assert "collected so far" in player.not_yet(8, ",".join(results))
                player.cli("sandbox", "kill", *fork_ids)
        assert len(set(results)) == 5
        player.not_yet(8, ",".join(results[:4] + ["fork-made-up"]))
        player.solve(8, ",".join(results))
    else:
        assert player.check(8)["state"] == "skipped"
        player.solve(8)

    # Level 9: each user their own sandbox, the same one when they come back (SDK for the code).
    player.open_level(9)
    assert "no sandbox of their own" in player.not_yet(9)
    users = [f"{lab_id}-{name}" for name in ("alice", "bob", "carol")]
    own = {}
    for user in users:
        first = player.api("POST", f"/workspaces/{user}/sandbox", {})
        again = player.api("POST", f"/workspaces/{user}/sandbox", {})
        assert first["sandbox"]["sandboxID"] == again["sandbox"]["sandboxID"]
        own[user] = first["sandbox"]["sandboxID"]
    from e2b import Sandbox

    assert Sandbox.connect(own[users[0]]).commands.run("echo mine").stdout.strip() == "mine"
    assert len(set(own.values())) == 3
    player.solve(9)
    player.cli("sandbox", "kill", *own.values())  # room on a small disk for the levels after

    # Level 10: a write lands in the sandbox's own layer; the template's layer is untouched.
    player.open_level(10)
    text = player.observe(10)["text"]
    other = player.cli("sandbox", "create", started["templateID"]).stdout.strip()
    player.not_yet(10, other)
    player.not_yet(10, sid)
    player.cli("sandbox", "exec", sid, "-u", "root", "--", f"printf %s {text} > /opt/warren-lab/template-canary.txt")
    player.solve(10, other)

    # Level 11: the token leaves the sandbox for a header rule; only its API is allowed out.
    player.open_level(11)
    token = player.cli("sandbox", "exec", sid, "--", "cat", "~/.config/lab-api/token").stdout.strip()
    assert token.startswith("lab-")
    player.not_yet(11)
    rules = {"api.lab.test": [{"transform": {"headers": {"Authorization": f"Bearer {token}"}}}]}
    player.api("PUT", f"/sandboxes/{sid}/network", {"allowOut": ["api.lab.test", "198.18.0.9"],
                                                    "denyOut": ["0.0.0.0/0"], "rules": rules})
    player.cli("sandbox", "exec", sid, "--", "rm", "-f", "~/.config/lab-api/token")
    assert "198.18.0.9" in player.not_yet(11), "a second allowed address fails the level"
    player.api("PUT", f"/sandboxes/{sid}/network", {"allowOut": ["api.lab.test"],
                                                    "denyOut": ["0.0.0.0/0"], "rules": rules})
    player.solve(11)

    # Level 12: sandboxes nobody tracks, found by their metadata and reclaimed.
    player.open_level(12)
    assert "crashed" in player.not_yet(12)
    player.not_yet(12)
    listed = json.loads(player.cli("sandbox", "list", "-m", "worker=crashed", "--json").stdout)
    assert len(listed) == 2, listed
    player.cli("sandbox", "kill", *[s["sandboxID"] for s in listed])
    player.solve(12)

    status = json.loads(player.cli("lab", "status", "--json").stdout)
    assert [level["state"] for level in status["levels"]] == ["solved"] * 12, status

    # A flag forged in the sandbox's own files is caught by status (the host holds the secret).
    player.cli("sandbox", "exec", sid, "--", "python3 -c \"import json,os; p=os.path.expanduser('~/.warren-lab/progress.json'); d=json.load(open(p)); d['levels']['12']['solved']='WARREN{forged}'; json.dump(d, open(p,'w'))\"")
    status = json.loads(player.cli("lab", "status", "--json").stdout)
    assert status["levels"][11]["state"] == "forged", status

    reset = json.loads(player.cli("lab", "reset", "--json").stdout)
    assert reset["sandboxID"] != sid and reset["labID"] != lab_id
    player.sandbox_id = reset["sandboxID"]
    status = json.loads(player.cli("lab", "status", "--json").stdout)
    assert status["levels"][0]["state"] == "open" and status["levels"][1]["state"] == "locked", status

    player.cli("lab", "stop")
    for gone in (sid, reset["sandboxID"], *own.values()):
        state = player.api("GET", f"/sandboxes/{gone}").get("state") if _exists(player, gone) else None
        assert state not in ("running", "paused"), (gone, state)
    assert player.cli("lab", "status", ok=False).returncode != 0


def _exists(player, sandbox_id):
    try:
        player.api("GET", f"/sandboxes/{sandbox_id}")
        return True
    except urllib.error.HTTPError as error:
        assert error.code == 404
        return False
