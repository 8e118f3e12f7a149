"""The Warren lab: a capture-the-flag course served from inside a sandbox (docs/lab.md).

Standard library only, no network fetches. The app sets up each level's trouble inside this sandbox,
reports what it observes to the judge (`warren lab check N`, on the host, which also looks through
Warren's API), and unlocks the next level when the player types the flag the judge revealed. It never
knows a flag before the judge hands it over: it holds only the SHA-256 of each flag, so it can tell a
right flag from a wrong one and nothing more.
"""

import hashlib
import html
import json
import os
import secrets
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("LAB_PORT", "8080"))
HOME = os.path.expanduser("~")
STATE_DIR = os.path.join(HOME, ".warren-lab")
PROGRESS = os.path.join(STATE_DIR, "progress.json")
COURSE = "/opt/warren-lab/lab.md"
CANARY = "/opt/warren-lab/template-canary.txt"
TOKEN_FILE = os.path.join(HOME, ".config", "lab-api", "token")
BLOB_DIR = "/tmp/.cache-lab"
TASK_SECONDS = 30

LEVELS = {
    1: ("Where am I?", "Find the ID of the sandbox you are in: the URL of this page, the hostname and "
        "the environment all say it. Report it: <code>warren lab check 1 --answer ID</code>.",
        ["The host part of this page's URL is <code>PORT-ID.DOMAIN</code>.", "<code>hostname</code>"]),
    2: ("Runaway", "A process of this sandbox uses a whole core. Find it and kill it, then run "
        "<code>warren lab check 2</code>.",
        ["<code>warren sandbox top ID</code> lists processes busiest first.",
         "<code>warren sandbox kill-process ID PID</code>, or <code>kill</code> in a shell."]),
    3: ("Memory hog", "A process grows towards this sandbox's memory limit. Stop it before the kernel's "
        "OOM killer does, then run <code>warren lab check 3</code>. If the OOM killer gets there first, "
        "reload this page to start it again.",
        ["<code>warren sandbox top ID</code> shows RSS.", "<code>warren sandbox metrics ID</code>"]),
    4: ("Full disk", "A 512 MiB file appeared under <code>/tmp</code>. Find its path and remove it, then "
        "run <code>warren lab check 4</code>.",
        ["<code>warren sandbox du ID</code> lists the largest files the sandbox wrote."]),
    5: ("Lifecycle", "A task runs for " + str(TASK_SECONDS) + " seconds from when you opened this page. "
        "While it runs, give the sandbox two hours or more and run <code>warren lab check 5</code>; once it "
        "is done, give it 15 minutes or less and check again. The judge reads the end time from the API. "
        "Afterwards give it an hour again (the lab sandbox pauses at its timeout; "
        "<code>warren lab start</code> resumes it).",
        ["<code>warren sandbox timeout ID SECONDS</code>, or <code>sandbox.set_timeout()</code>.",
         "<code>warren sandbox get ID</code> shows the end time."]),
    6: ("Pause and resume", "Pause this sandbox with its memory and resume it, then run "
        "<code>warren lab check 6</code>. The counter below lives only in this app's memory: it must "
        "survive, and it does not count the seconds the sandbox spent paused.",
        ["<code>warren sandbox pause ID</code>, <code>warren sandbox resume ID</code>.",
         "<code>--files-only</code> keeps the files and reboots the processes: the counter would be lost."]),
    7: ("Orphans", "A resumed job left <code>orphan-worker</code> processes behind: their parent is gone. "
        "List them and kill them, then run <code>warren lab check 7</code>.",
        ["<code>warren sandbox orphans ID</code> and <code>--kill</code>.",
         "The policy way: <code>warren up --reap-orphans-on-resume</code> or the sandbox's "
         "<code>policies.reapOrphansOnResume</code>."]),
    8: ("Fork", "Fork this sandbox five times. Each fork's copy of this app hands out its own result at "
        "<code>/api/fork-result</code> on port " + str(PORT) + " of that fork. Collect five and report "
        "them: <code>warren lab check 8 --answer R1,R2,R3,R4,R5</code>.",
        ["<code>sandbox.fork(count=5, timeout=300)</code>, or <code>POST /sandboxes/ID/fork</code>: forks "
         "live 15 seconds unless you give them a timeout.",
         "Reach a fork's port through the proxy: <code>http://PORT-FORKID.DOMAIN/</code>."]),
    9: ("Workspaces", "Your app serves the users <code>LABID-alice</code>, <code>LABID-bob</code> and "
        "<code>LABID-carol</code> and hands out sandboxes round-robin, so users land in each other's "
        "sandboxes. Give each one their own with <code>POST /workspaces/{user}/sandbox</code> (the SDK "
        "with httpx, or <code>warren workspace get</code>), call it twice per user, then run "
        "<code>warren lab check 9</code>: the judge comes back as each user and must land in the "
        "same sandbox.",
        ["docs/operations.md, \"Users get a different sandbox on every visit\"."]),
    10: ("Layers", "Write the text shown below into <code>" + CANARY + "</code> (a file of the lab "
         "template) in this sandbox. Then create a second sandbox from the lab template and report its "
         "ID: <code>warren lab check 10 --answer ID</code>. The judge reads the file in both: your write "
         "went to this sandbox's writable layer, and the template's read-only layer below it is "
         "untouched.",
         ["<code>sudo</code> works in the sandbox.", "<code>warren sandbox create TEMPLATE</code>"]),
    11: ("Secrets and egress", "An API token for <code>api.lab.test</code> sits in <code>" + TOKEN_FILE +
         "</code>. Get it out of the sandbox: allow only <code>api.lab.test</code> out, deny everything "
         "else, and have Warren add <code>Authorization: Bearer TOKEN</code> to requests for that host "
         "on the way out. Then delete the file and run <code>warren lab check 11</code>.",
         ["<code>sandbox.update_network(...)</code> or <code>PUT /sandboxes/ID/network</code> with "
          "<code>denyOut: [\"0.0.0.0/0\"]</code>, <code>allowOut</code> and <code>rules</code>.",
          "docs/network.md, \"Header rules\"; docs/secrets.md."]),
    12: ("Lost sandboxes", "Run <code>warren lab check 12</code> once: a crashed worker of your team "
         "then leaves sandboxes running that nothing tracks. Find them and reclaim them, then check "
         "again.",
         ["<code>warren sandbox list</code> with its metadata.",
          "docs/operations.md on sandboxes Warren itself lost track of."]),
}

lock = threading.RLock()
# Held only in memory (level 6): a checkpoint keeps it, a reboot loses it.
memory = {"nonce": None, "ticks": 0, "fork": {}}
children = {}


def load():
    try:
        with open(PROGRESS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"setup": None, "current": 1, "levels": {}}


def save(progress):
    os.makedirs(STATE_DIR, exist_ok=True)
    tmp = PROGRESS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(progress, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, PROGRESS)


def level_state(progress, n):
    return progress["levels"].setdefault(str(n), {})


def spawn(name, code):
    """A child running `code` in Python under the process name `name`."""
    return subprocess.Popen(["bash", "-c", 'exec -a "$0" python3 -c "$1"', name, code],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def alive(pid):
    child = children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def pids_named(name):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if argv0 == name:
            found.append(int(entry))
    return found


def own_id():
    try:
        with open("/etc/hostname") as f:
            return f.read().strip()
    except OSError:
        return ""


def begin(n, state):
    """Sets up level n's trouble; its facts go into `state`."""
    state["started"] = time.time()
    if n == 2:
        child = spawn("lab-spinner", "while True: pass")
        children[child.pid] = child
        state["pid"] = child.pid
    elif n == 3:
        child = spawn("lab-hog", "import time\nb=[]\nwhile True:\n b.append(bytearray(4<<20))\n"
                      " time.sleep(0.5)")
        children[child.pid] = child
        state["pid"] = child.pid
    elif n == 4:
        os.makedirs(BLOB_DIR, exist_ok=True)
        path = os.path.join(BLOB_DIR, "blob-" + secrets.token_hex(4) + ".bin")
        chunk = b"\xa5" * (8 << 20)
        with open(path, "wb") as f:
            for _ in range(64):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        state["path"] = path
    elif n == 5:
        child = spawn("lab-task", f"import time\ntime.sleep({TASK_SECONDS})")
        children[child.pid] = child
        state["pid"] = child.pid
        state["phase"] = "running"
    elif n == 6:
        memory["nonce"] = secrets.token_hex(8)
        memory["ticks"] = 0
        state["nonce_sha256"] = hashlib.sha256(memory["nonce"].encode()).hexdigest()
    elif n == 7:
        # Each worker's parent shell exits at once, so the worker is re-parented to PID 1.
        subprocess.run(["bash", "-c", "for i in 1 2 3; do (exec -a orphan-worker sleep 86400 &); done"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
    elif n == 10:
        state["text"] = "written-by-" + secrets.token_hex(6)
    elif n == 11:
        os.makedirs(os.path.dirname(TOKEN_FILE), exist_ok=True)
        state["token"] = "lab-" + secrets.token_hex(12)
        with open(TOKEN_FILE, "w") as f:
            f.write(state["token"] + "\n")


def observe(n, state):
    """What this app sees of level n now (the judge checks it with what the API shows)."""
    seen = {"level": n, "started": state.get("started"), "sandboxID": own_id()}
    if n in (2, 3, 5) and "pid" in state:
        seen["running"] = alive(state["pid"])
        child = children.get(state["pid"])
        seen["exitCode"] = child.returncode if child is not None else None
    if n == 2:
        seen["spinners"] = len(pids_named("lab-spinner"))
    if n == 3:
        seen["hogs"] = len(pids_named("lab-hog"))
    if n == 4 and "path" in state:
        seen["path"] = state["path"]
        seen["present"] = os.path.exists(state["path"])
    if n == 6:
        held = memory["nonce"]
        seen["memoryKept"] = held is not None and \
            hashlib.sha256(held.encode()).hexdigest() == state.get("nonce_sha256")
        seen["counter"] = memory["ticks"]
    if n == 7:
        seen["orphanWorkers"] = len(pids_named("orphan-worker"))
    if n == 10:
        seen["text"] = state.get("text")
    if n == 11:
        seen["tokenFilePresent"] = os.path.exists(TOKEN_FILE)
        seen["token"] = state.get("token")
    return seen


def ticker():
    while True:
        time.sleep(1)
        with lock:
            memory["ticks"] += 1


def page(title, body):
    return ("<!doctype html><html><head><meta charset=utf-8><title>" + html.escape(title) +
            " - Warren lab</title><style>body{font-family:sans-serif;max-width:46em;margin:2em auto}"
            "code{background:#eee;padding:0 .2em}.flag{font-family:monospace;background:#dfd;padding:.3em}"
            "</style></head><body><p><a href=/>Warren lab</a> &middot; <a href=/course>course text</a></p>"
            + body + "</body></html>")


def level_page(progress, n, note=""):
    title, text, hints = LEVELS[n]
    state = level_state(progress, n)
    sid = (progress.get("setup") or {}).get("sandboxID", "ID")
    lab_id = (progress.get("setup") or {}).get("labID", "LABID")
    text = text.replace("LABID", html.escape(lab_id))
    body = f"<h1 id=title>Level {n}: {html.escape(title)}</h1>"
    if note:
        body += f"<p id=note><b>{html.escape(note)}</b></p>"
    if n > progress["current"] and "solved" not in state:
        return page(title, body + "<p id=locked>Locked: solve the levels before it first.</p>")
    body += f"<p>{text}</p><p>This sandbox: <code>{html.escape(sid)}</code></p>"
    if n == 5 and "phase" in state:
        body += f"<p>Task: <b id=phase>{html.escape(state['phase'])}</b></p>"
    if n == 6:
        body += f"<p>Counter (seconds this app has run since the level began): <b id=counter>" \
                f"{memory['ticks']}</b></p>"
    if n == 10 and "text" in state:
        body += f"<p>Text to write: <code id=text>{html.escape(state['text'])}</code></p>"
    body += "<details><summary>Hints</summary><ul>" + "".join(f"<li>{h}</li>" for h in hints) + \
            "</ul></details>"
    if state.get("skipped"):
        body += f"<p id=skipped>The server cannot do this level: {html.escape(state['skipped'])}</p>"
    if "revealed" in state:
        body += f"<p>Solved. Your flag: <span class=flag id=flag>{html.escape(state['revealed'])}</span></p>"
    else:
        body += f"<p>When you are done, run <code>warren lab check {n}</code> on the host: the judge " \
                "looks, and reveals the flag here.</p>"
    if "solved" in state:
        body += "<p id=done>Flag accepted.</p>"
    else:
        body += f"<form method=post action=/level/{n}/flag><input name=flag size=50 " \
                "placeholder=WARREN{...}><button>Submit flag</button></form>"
    return page(title, body)


def index_page(progress):
    rows = ""
    for n, (title, _, _) in LEVELS.items():
        state = progress["levels"].get(str(n), {})
        mark = "solved" if "solved" in state else ("open" if n == progress["current"] else
                                                  ("" if n < progress["current"] else "locked"))
        rows += f"<li><a href=/level/{n}>Level {n}: {html.escape(title)}</a> {mark}</li>"
    return page("Warren lab", "<h1>Warren lab</h1><p>Break a sandbox on purpose and fix it, twelve "
                "times. Each level has instructions and hints; <code>warren lab check N</code> on the host "
                "judges it and reveals the flag on the level's page; the flag unlocks the next level.</p>"
                f"<ol>{rows}</ol>")


class Handler(BaseHTTPRequestHandler):
    server_version = "warren-lab"

    def log_message(self, *args):
        pass

    def reply(self, status, body, kind="text/html; charset=utf-8", headers=()):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def json(self, status, value):
        self.reply(status, json.dumps(value), "application/json")

    def body(self):
        length = min(int(self.headers.get("Content-Length") or 0), 1 << 16)
        return self.rfile.read(length)

    def level_number(self, text):
        try:
            n = int(text)
        except ValueError:
            return None
        return n if n in LEVELS else None

    def do_GET(self):
        path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
        parts = path.strip("/").split("/")
        with lock:
            progress = load()
            if path == "/":
                return self.reply(200, index_page(progress))
            if path == "/course":
                try:
                    with open(COURSE, "rb") as f:
                        return self.reply(200, f.read(), "text/markdown; charset=utf-8")
                except OSError:
                    return self.reply(404, "no course text")
            if path == "/api/progress":
                levels = {}
                for n, (title, _, _) in LEVELS.items():
                    state = progress["levels"].get(str(n), {})
                    levels[str(n)] = {"title": title, "started": "started" in state,
                                      "solved": state.get("solved"), "skipped": state.get("skipped")}
                return self.json(200, {"current": progress["current"], "levels": levels,
                                       "setUp": progress.get("setup") is not None})
            if path == "/api/fork-result":
                me = own_id()
                origin = (progress.get("setup") or {}).get("sandboxID")
                if not me or me == origin:
                    return self.json(409, {"message": "this is the lab sandbox itself, not a fork"})
                token = memory["fork"].setdefault(me, "fork-" + secrets.token_hex(6))
                return self.json(200, {"sandboxID": me, "result": token})
            if len(parts) == 3 and parts[:2] == ["api", "observe"]:
                n = self.level_number(parts[2])
                if n is None:
                    return self.json(404, {"message": "no such level"})
                state = level_state(progress, n)
                seen = observe(n, state)
                if n == 5 and state.get("phase") == "running" and not seen.get("running"):
                    state["phase"] = "done"
                    state["doneAt"] = time.time()
                    save(progress)
                seen["phase"] = state.get("phase")
                seen["phaseA"] = state.get("phaseA")
                return self.json(200, seen)
            if len(parts) == 2 and parts[0] == "level":
                n = self.level_number(parts[1])
                if n is None:
                    return self.reply(404, page("no such level", "<p>No such level.</p>"))
                state = level_state(progress, n)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                again = "restart" in query and n in (3, 5) and "revealed" not in state
                if n == progress["current"] and progress.get("setup") and \
                        ("started" not in state or again):
                    state.pop("phaseA", None)
                    begin(n, state)
                    save(progress)
                if n == 5 and state.get("phase") == "running" and not alive(state.get("pid", 0)):
                    state["phase"] = "done"
                    save(progress)
                return self.reply(200, level_page(progress, n))
        self.reply(404, page("not found", "<p>Not found.</p>"))

    def do_POST(self):
        path = urllib.parse.urlsplit(self.path).path.rstrip("/")
        parts = path.strip("/").split("/")
        raw = self.body()
        with lock:
            progress = load()
            if path == "/api/setup":
                if progress.get("setup"):
                    return self.json(409, {"message": "already set up"})
                try:
                    setup = json.loads(raw)
                    assert isinstance(setup["hashes"], dict) and setup["sandboxID"] and setup["labID"]
                except (ValueError, KeyError, AssertionError, TypeError):
                    return self.json(400, {"message": "expected {labID, sandboxID, hashes}"})
                progress = {"setup": setup, "current": 1, "levels": {}}
                save(progress)
                return self.json(200, {"ok": True})
            if len(parts) == 3 and parts[:2] == ["api", "reveal"]:
                n = self.level_number(parts[2])
                if n is None or not progress.get("setup"):
                    return self.json(404, {"message": "no such level"})
                try:
                    given = json.loads(raw)
                    flag = str(given["flag"])
                except (ValueError, KeyError, TypeError):
                    return self.json(400, {"message": "expected {flag}"})
                if not self.flag_ok(progress, n, flag):
                    return self.json(403, {"message": "that is not this level's flag"})
                state = level_state(progress, n)
                state["revealed"] = flag
                if given.get("skipped"):
                    state["skipped"] = str(given["skipped"])[:300]
                save(progress)
                return self.json(200, {"ok": True})
            if len(parts) == 3 and parts[:2] == ["api", "phase-a"]:
                # The judge saw level 5's long timeout while the task ran.
                state = level_state(progress, 5)
                if state.get("phase") != "running" or not alive(state.get("pid", 0)):
                    return self.json(409, {"message": "the task is not running"})
                state["phaseA"] = True
                save(progress)
                return self.json(200, {"ok": True})
            if len(parts) == 3 and parts[0] == "level" and parts[2] == "flag":
                n = self.level_number(parts[1])
                if n is None:
                    return self.reply(404, page("no such level", "<p>No such level.</p>"))
                flag = urllib.parse.parse_qs(raw.decode(errors="replace")).get("flag", [""])[0].strip()
                state = level_state(progress, n)
                if n > progress["current"] and "solved" not in state:
                    return self.reply(403, level_page(progress, n, "This level is locked."))
                if not self.flag_ok(progress, n, flag):
                    return self.reply(400, level_page(progress, n, "Wrong flag."))
                state["solved"] = flag
                if n == progress["current"]:
                    progress["current"] = n + 1
                save(progress)
                target = f"/level/{n + 1}" if n + 1 in LEVELS else "/"
                return self.reply(303, "", headers=[("Location", target)])
        self.reply(404, page("not found", "<p>Not found.</p>"))

    @staticmethod
    def flag_ok(progress, n, flag):
        want = ((progress.get("setup") or {}).get("hashes") or {}).get(str(n))
        return bool(want) and secrets.compare_digest(
            hashlib.sha256(flag.encode()).hexdigest(), want)


def main():
    progress = load()
    state = progress["levels"].get("6", {})
    if "started" in state and "solved" not in state:
        # Started fresh while level 6 was open: this process never held the level's memory.
        memory["nonce"] = None
    threading.Thread(target=ticker, daemon=True).start()
    ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()


if __name__ == "__main__":
    main()
