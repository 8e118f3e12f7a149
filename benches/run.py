#!/usr/bin/env python3
"""Warren's benchmarks: each figure is measured next to a baseline taken in the same run on the same host.

Prints one table (figure, value, baseline, ratio) and writes the same data as JSON next to it, so runs can be
compared. Every benchmark cleans up after itself. Run through ./warren-bench (see README).
"""
from __future__ import annotations

import argparse
import base64
import concurrent.futures as cf
import http.server
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE_ROOTFS = Path(os.environ.get("WARREN_CACHE", "/var/cache/warren")) / "rootfs/debian12-base"
CODE_INTERPRETER_ROOTFS = Path(os.environ.get("WARREN_CACHE", "/var/cache/warren")) / "rootfs/debian12-code-interpreter"


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


@dataclass
class Row:
    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0) or self.value != self.value:
            return None
        return self.value / self.baseline


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        r = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        print(f"  {row.name}: {row.value:.3f} {row.unit} (baseline {row.baseline} {row.baseline_name}, {r})",
              flush=True)

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(f"{what}: {why}")
        print(f"SKIP: {what}: {why}", flush=True)


# ---------------------------------------------------------------------------------------------- warren up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Warren:
    """A real `warren up` on free loopback ports with a temporary state directory."""

    def __init__(self, warren_bin: Path, agent_bin: Path, max_sandboxes: int):
        self.state = Path(tempfile.mkdtemp(prefix="warren-bench-"))
        self.api_port, self.proxy_port = free_port(), free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.sandbox_url = f"http://127.0.0.1:{self.proxy_port}"
        self.log = open(self.state / "warren.log", "w")
        cmd = [str(warren_bin), "up", "--state-dir", str(self.state / "state"),
               "--listen", f"127.0.0.1:{self.api_port}", "--proxy-listen", f"127.0.0.1:{self.proxy_port}",
               "--api-url", self.api_url, "--sandbox-url", self.sandbox_url, "--agent", str(agent_bin),
               "--max-sandboxes", str(max_sandboxes), "--max-total-vcpus", str(max_sandboxes * 2),
               "--max-total-memory-mib", str(max_sandboxes * 512),
               # Admission holds every sandbox's task limit and whole writable layer against the
               # host's real PID capacity and free disk: keep both small enough for the density runs.
               "--sandbox-max-pids", "256", "--sandbox-disk-mib", "160"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.api_key = ""
        deadline = time.monotonic() + 120
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"warren up exited early; see {self.state / 'warren.log'}")
            if "E2B_API_KEY=" in line:
                self.api_key = line.strip().split("E2B_API_KEY=", 1)[1]
                break
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self._wait_health(deadline)
        os.environ.update(E2B_API_URL=self.api_url, E2B_SANDBOX_URL=self.sandbox_url,
                          E2B_API_KEY=self.api_key)

    def _wait_health(self, deadline: float) -> None:
        import httpx
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("warren up did not answer /health")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        # Warren's lxcfs daemon outlives `warren up` on purpose; detaching its mount ends it (removing
        # the state directory under it would not).
        subprocess.run(["umount", "-l", str(self.state / "state" / "lxcfs")], check=False,
                       stderr=subprocess.DEVNULL)


def kill_all(sandboxes) -> None:
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: _quiet(s.kill), sandboxes))


def _quiet(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - clean-up must go on
        return None


# ------------------------------------------------------------------------------------------- baselines


class Overlay:
    """The floor for a sandbox's start: an overlay mount of the base rootfs plus `unshare` into it."""

    def __init__(self, lower: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="warren-bench-ovl-"))
        for d in ("upper", "work", "merged"):
            (self.dir / d).mkdir()
        self.lower = lower

    def run_once(self, argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.lower},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
                        str(self.dir / "merged")], check=True)
        subprocess.run(["unshare", "--pid", "--mount", "--net", "--uts", "--ipc", "--fork",
                        "chroot", str(self.dir / "merged"), *argv], check=True)
        elapsed = time.perf_counter() - t0
        subprocess.run(["umount", str(self.dir / "merged")], check=True)
        return elapsed

    def cleanup(self) -> None:
        subprocess.run(["umount", "-q", str(self.dir / "merged")], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class EchoServer:
    """Loopback HTTP/1.1 server answering every request with a tiny body: the floor for a round trip."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms.
            disable_nagle_algorithm = True

            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


# ------------------------------------------------------------------------------------------ benchmarks


RUNNING_TEMPLATE = "bench-running-state"


def build_running_template() -> str:
    """Builds (or reuses from the layer cache) a template whose start_cmd is an HTTP server, so that
    its sandboxes resume a checkpoint of that running server instead of booting cold."""
    from e2b import Template, wait_for_port
    template = (
        Template()
        .from_image("debian:bookworm")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    Template.build(template, alias=RUNNING_TEMPLATE)
    return RUNNING_TEMPLATE


def create_samples(n: int, first_command: bool, template: str = "base") -> list[float]:
    """Milliseconds of `n` sequential creates (each up to its first answered command if asked), killed after."""
    from e2b import Sandbox
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = Sandbox.create(template=template, timeout=120)
        if first_command:
            sbx.commands.run("true")
        samples.append((time.perf_counter() - t0) * 1000)
        sbx.kill()
    return samples


def bench_create(rep: Report, n: int, overlay: Overlay | None) -> float:
    samples = create_samples(n, first_command=True)
    floor = [overlay.run_once(["/bin/true"]) * 1000 for _ in range(min(n, 50))] if overlay else []
    p50f = pct(floor, 50) if floor else None
    rep.add(Row("create -> first command p50 (cold base)", pct(samples, 50), "ms", p50f,
                "unshare+overlay p50", "<= 30 ms"))
    rep.add(Row("create -> first command p99 (cold base)", pct(samples, 99), "ms",
                pct(floor, 99) if floor else None, "unshare+overlay p99"))
    try:
        template = build_running_template()
    except Exception as e:  # noqa: BLE001 - a failed build is reported, the other figures still count
        rep.skip("create -> first command (running-state template)", f"template build failed: {e}")
    else:
        running = create_samples(n, first_command=True, template=template)
        rep.add(Row("create -> first command p50 (running-state template)", pct(running, 50), "ms", p50f,
                    "unshare+overlay p50", "<= 30 ms", note="resumes a checkpoint of python3 -m http.server"))
        rep.add(Row("create -> first command p99 (running-state template)", pct(running, 99), "ms",
                    pct(floor, 99) if floor else None, "unshare+overlay p99"))
    return pct(samples, 50)


def create_p50_only(n: int) -> float:
    """Sequential create p50 without a table row: the baseline that fork and the concurrent creates need."""
    return pct(create_samples(n, first_command=False), 50)


def connect_run_true(client, sbx) -> None:
    """One `process.Process/Start` of `bash -l -c true` as a bare Connect (JSON) call: what the SDK
    sends, without the SDK, so its own cost can be told apart from Warren's."""
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"], "envs": {}}}).encode()
    headers = {**sbx.connection_config.sandbox_headers,
               "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
               "Authorization": "Basic " + base64.b64encode(b"user:").decode()}
    reply = client.post(f"{sbx.envd_api_url}/process.Process/Start",
                        content=b"\x00" + len(body).to_bytes(4, "big") + body, headers=headers)
    reply.raise_for_status()
    data, ended = reply.content, False
    while len(data) >= 5:
        size = int.from_bytes(data[1:5], "big")
        message = json.loads(data[5:5 + size] or b"{}")
        if data[0] & 2:
            if message.get("error"):
                raise RuntimeError(f"process.Start failed: {message['error']}")
        elif "end" in message.get("event", {}):
            end = message["event"]["end"]
            if end.get("exitCode", 0) != 0:
                raise RuntimeError(f"`true` exited {end}")
            ended = True
        data = data[5 + size:]
    if not ended:
        raise RuntimeError("process.Start stream ended without an end event")


def bench_exec(rep: Report, n: int) -> None:
    import httpx
    from e2b import Sandbox
    sbx = Sandbox.create(template="base", timeout=300)
    try:
        sbx.commands.run("true")
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            sbx.commands.run("true")
            samples.append((time.perf_counter() - t0) * 1000)
        with httpx.Client() as client:
            connect_run_true(client, sbx)
            bare = []
            for _ in range(n):
                t0 = time.perf_counter()
                connect_run_true(client, sbx)
                bare.append((time.perf_counter() - t0) * 1000)
    finally:
        sbx.kill()
    echo = EchoServer()
    try:
        with httpx.Client() as client:
            client.post(echo.url, content=b"x")
            base = []
            for _ in range(n):
                t0 = time.perf_counter()
                client.post(echo.url, content=b"x")
                base.append((time.perf_counter() - t0) * 1000)
    finally:
        echo.stop()
    rep.add(Row("commands.run('true') p50 via SDK + proxy", pct(samples, 50), "ms", pct(base, 50),
                "loopback HTTP echo p50", "<= 3 ms"))
    rep.add(Row("commands.run('true') p99 via SDK + proxy", pct(samples, 99), "ms", pct(base, 99),
                "loopback HTTP echo p99"))
    rep.add(Row("bash -l -c true p50, bare Connect call via proxy", pct(bare, 50), "ms", pct(base, 50),
                "loopback HTTP echo p50", note="same request as the SDK's, sent with httpx"))


def bench_files(rep: Report, mib: int) -> None:
    from e2b import Sandbox
    data = os.urandom(mib << 20)
    sbx = Sandbox.create(template="base", timeout=300)
    try:
        t0 = time.perf_counter()
        sbx.files.write("/home/user/blob", data)
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = sbx.files.read("/home/user/blob", format="bytes")
        down = time.perf_counter() - t0
        if bytes(back) != data:
            raise RuntimeError("downloaded file differs from the uploaded one")
    finally:
        sbx.kill()
    tmp = Path(tempfile.mkdtemp(prefix="warren-bench-cp-"))
    try:
        (tmp / "a").write_bytes(data)
        t0 = time.perf_counter()
        subprocess.run(["cp", str(tmp / "a"), str(tmp / "b")], check=True)
        cp = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cp_rate = mib * 1.048576 / cp
    rep.add(Row(f"upload {mib} MiB via SDK", mib * 1.048576 / up, "MB/s", cp_rate, "cp MB/s", ">= 300 MB/s"))
    rep.add(Row(f"download {mib} MiB via SDK", mib * 1.048576 / down, "MB/s", cp_rate, "cp MB/s",
                ">= 300 MB/s"))


def bench_pause_resume(rep: Report, sizes: list[int]) -> None:
    from e2b import Sandbox
    for mib in sizes:
        sbx = Sandbox.create(template="base", timeout=600)
        try:
            sbx.commands.run(
                f"python3 -c 'import time; b = bytearray({mib} << 20); b[::4096] = b\"x\" * len(b[::4096]);"
                f" open(\"/tmp/ready\", \"w\").close(); time.sleep(3600)'", background=True)
            for _ in range(200):
                if sbx.files.exists("/tmp/ready"):
                    break
                time.sleep(0.05)
            t0 = time.perf_counter()
            sbx.pause()
            pause = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            again = Sandbox.connect(sbx.sandbox_id)
            again.commands.run("true")
            resume = (time.perf_counter() - t0) * 1000
        except Exception as err:  # noqa: BLE001 - reported, not hidden
            rep.skip(f"pause/resume {mib} MiB", f"{type(err).__name__}: {err}")
            _quiet(sbx.kill)
            continue
        _quiet(sbx.kill)
        tmp = Path(tempfile.mkdtemp(prefix="warren-bench-mem-"))
        try:
            t0 = time.perf_counter()
            with open(tmp / "m", "wb") as f:
                f.write(os.urandom(mib << 20))
                f.flush()
                os.fsync(f.fileno())
            write_ms = (time.perf_counter() - t0) * 1000
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rep.add(Row(f"pause {mib} MiB resident", pause, "ms", write_ms, f"write+fsync {mib} MiB"))
        rep.add(Row(f"resume {mib} MiB resident (to first command)", resume, "ms", write_ms,
                    f"write+fsync {mib} MiB", "<= 50 ms for 100 MiB" if mib == 100 else ""))


def bench_fork(rep: Report, count: int, create_p50: float) -> None:
    from e2b import Sandbox
    sbx = Sandbox.create(template="base", timeout=300)
    forks = []
    try:
        t0 = time.perf_counter()
        forks = sbx.fork(count=count)
        elapsed = (time.perf_counter() - t0) * 1000
        failed = [f for f in forks if isinstance(f, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} of {count} forks failed: {failed[0]}")
        rep.add(Row(f"fork x{count}", elapsed, "ms", create_p50 * count, f"{count} x create p50"))
    except Exception as err:  # noqa: BLE001 - reported, not hidden
        rep.skip(f"fork x{count}", f"{type(err).__name__}: {err}")
    finally:
        kill_all([f for f in forks if not isinstance(f, Exception)] + [sbx])


def bench_concurrent_density(rep: Report, total: int, threads: int, create_p50: float,
                             overlay: Overlay | None) -> list:
    from e2b import Sandbox
    before = mem_available_kib()
    errors: list[str] = []
    samples: list[float] = []
    lock = threading.Lock()

    def one(_):
        t0 = time.perf_counter()
        try:
            sbx = Sandbox.create(template="base", timeout=600)
        except Exception as err:  # noqa: BLE001 - counted
            with lock:
                errors.append(f"{type(err).__name__}: {err}")
            return None
        with lock:
            samples.append((time.perf_counter() - t0) * 1000)
        return sbx

    with cf.ThreadPoolExecutor(threads) as pool:
        made = [s for s in pool.map(one, range(total)) if s is not None]
    rep.add(Row(f"{total} creates from {threads} threads p99", pct(samples, 99), "ms", create_p50,
                "sequential create p50", note=f"{len(errors)} errors" + (f" ({errors[0]})" if errors else "")))
    time.sleep(3)
    # What Warren adds per idle sandbox: the sandbox's cgroup (the agent and its kernel memory) plus the
    # host-side supervisor process. Host MemAvailable deltas are too noisy on a shared machine.
    per_sandbox = [sandbox_overhead_bytes(s.sandbox_id) for s in made]
    per_sandbox = [b for b in per_sandbox if b is not None]
    host_delta = (before - mem_available_kib()) / 1024 / max(1, len(made))
    floor = None
    if overlay:
        procs = [subprocess.Popen(["unshare", "--pid", "--mount", "--net", "--fork", "sleep", "600"])
                 for _ in range(20)]
        time.sleep(1)
        rss = [tree_pss_bytes(p.pid) for p in procs]
        floor = statistics.mean(rss) / 2**20
        for p in procs:
            p.kill()
            p.wait()
    if per_sandbox:
        rep.add(Row(f"memory per idle sandbox ({len(per_sandbox)} running)",
                    statistics.mean(per_sandbox) / 2**20, "MiB", floor,
                    "unshare+sleep PSS (tree)", "<= 3 MiB",
                    note=f"cgroup + supervisor PSS; host MemAvailable delta {host_delta:.1f} MiB each"))
    else:
        rep.skip("memory per idle sandbox", "no sandbox cgroup found to measure")
    return made


def pss_bytes(pid: int) -> int:
    """Proportional set size of `pid`: its private pages plus its share of pages mapped by several
    processes. RSS would charge every supervisor the whole text of the binary they all share."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_pss_bytes(pid: int) -> int:
    """PSS of `pid` and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += pss_bytes(p)
            for t in Path(f"/proc/{p}/task").iterdir():
                kids = (t / "children").read_text().split()
                todo.extend(int(k) for k in kids)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def sandbox_overhead_bytes(sandbox_id: str) -> int | None:
    """Memory charged to the sandbox's cgroup (v1 or v2) plus its supervisor's PSS on the host."""
    charged = None
    for path in (f"/sys/fs/cgroup/memory/warren/{sandbox_id}/memory.usage_in_bytes",
                 f"/sys/fs/cgroup/warren/{sandbox_id}/memory.current"):
        try:
            charged = int(Path(path).read_text())
            break
        except (FileNotFoundError, ValueError):
            continue
    if charged is None:
        return None
    supervisor = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"warren-supervisor" in cmd and sandbox_id.encode() in cmd:
            try:
                supervisor += pss_bytes(int(proc.name))
            except OSError:
                continue
    return charged + supervisor


def bench_list(rep: Report, running: list, want: int, n: int) -> None:
    import httpx
    from e2b import Sandbox
    extra = []
    need = max(0, want - len(running))
    with cf.ThreadPoolExecutor(8) as pool:
        extra = [s for s in pool.map(lambda _: _quiet(lambda: Sandbox.create(template="base", timeout=600)),
                                     range(need)) if s is not None]
    count = len(running) + len(extra)
    headers = {"X-API-Key": os.environ["E2B_API_KEY"]}
    api = os.environ["E2B_API_URL"]
    samples, base = [], []
    with httpx.Client(headers=headers, timeout=60) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.get(f"{api}/sandboxes")
            samples.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
        listed = len(r.json())
        for _ in range(n):
            t0 = time.perf_counter()
            client.get(f"{api}/health")
            base.append((time.perf_counter() - t0) * 1000)
    rep.add(Row(f"GET /sandboxes p99 with {listed} sandboxes", pct(samples, 99), "ms", pct(base, 99),
                "GET /health p99", note=f"{count} running"))
    kill_all(extra)


# ------------------------------------------------------------------------------------------------ main


def print_table(rep: Report) -> str:
    lines = [f"{'figure':58} {'value':>12} {'baseline':>12} {'ratio':>8}  target",
             "-" * 110]
    for r in rep.rows:
        base = f"{r.baseline:.3f}" if r.baseline is not None else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append(f"{r.name:58} {r.value:>9.3f} {r.unit:<3}{base:>12} {ratio:>8}  {r.target}"
                     + (f"  [{r.note}]" if r.note else ""))
        if r.baseline_name:
            lines.append(f"{'':58} {'':>12} {r.baseline_name[:40]:>12}")
    for s in rep.skipped:
        lines.append(f"SKIP: {s}")
    return "\n".join(lines)


def wait_template_ready(name: str, bound_s: float) -> str:
    """The status of template `name` once it is no longer being built (or when `bound_s` ran out)."""
    import httpx
    deadline = time.monotonic() + bound_s
    status = "missing"
    while time.monotonic() < deadline:
        answer = httpx.get(f"{os.environ['E2B_API_URL']}/templates/{name}",
                           headers={"X-API-Key": os.environ["E2B_API_KEY"]}, timeout=10)
        status = answer.json()["builds"][0]["status"] if answer.status_code == 200 else "missing"
        if status not in ("missing", "waiting", "building"):
            return status
        time.sleep(0.5)
    return status


def bench_code_interpreter(rep: Report, n: int, create_p50: float | None) -> None:
    """`e2b_code_interpreter`: create → first `run_code("1+1")`, and a cell's round trip beside
    `commands.run("python3 -c ...")` in the same sandbox."""
    try:
        from e2b_code_interpreter import Sandbox
    except ImportError:
        rep.skip("code interpreter", "e2b_code_interpreter is not installed (tests/sdk/requirements.txt)")
        return
    if not (CODE_INTERPRETER_ROOTFS / ".warren-complete").is_file():
        rep.skip("code interpreter", f"no code-interpreter rootfs at {CODE_INTERPRETER_ROOTFS} (scripts/setup)")
        return
    status = wait_template_ready("code-interpreter-v1", 900)
    if status != "ready":
        rep.skip("code interpreter", f"the code-interpreter-v1 template is {status}")
        return
    firsts, cells, shells = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = Sandbox.create(timeout=300)
        try:
            first = sbx.run_code("1+1")
            firsts.append((time.perf_counter() - t0) * 1000)
            assert first.text == "2", first
            for _ in range(5):
                t0 = time.perf_counter()
                sbx.run_code("1+1")
                cells.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                sbx.commands.run("python3 -c 'print(1+1)'")
                shells.append((time.perf_counter() - t0) * 1000)
        finally:
            sbx.kill()
    rep.add(Row("code interpreter: create -> first run_code('1+1') p50", pct(firsts, 50), "ms",
                create_p50, "base create p50", note="a checkpointed warm kernel"))
    rep.add(Row("run_code('1+1') round trip p50", pct(cells, 50), "ms", pct(shells, 50),
                "commands.run('python3 -c ...') p50"))


SECTIONS = {"create", "exec", "files", "pause", "fork", "density", "list", "interpreter"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warren", type=Path, required=True, help="the warren binary (release build)")
    ap.add_argument("--agent", type=Path, required=True, help="the static warren-agent binary")
    ap.add_argument("--out", type=Path, default=REPO / "benches/results", help="where the JSON goes")
    ap.add_argument("--creates", type=int, default=200)
    ap.add_argument("--execs", type=int, default=500)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--threads", type=int, default=20)
    ap.add_argument("--list-sandboxes", type=int, default=1000)
    ap.add_argument("--file-mib", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated sections to run "
                    "(create,exec,files,pause,fork,density,list,interpreter); default: all")
    args = ap.parse_args()
    if args.quick:
        args.creates, args.execs, args.concurrent, args.threads, args.list_sandboxes = 10, 50, 20, 5, 40
        args.file_mib = 16
    if os.geteuid() != 0:
        print("SKIP: benchmarks need root (sandboxes use namespaces, cgroups and a bridge)")
        return 0
    if not BASE_ROOTFS.is_dir():
        print(f"SKIP: base rootfs {BASE_ROOTFS} missing (run scripts/setup)")
        return 0
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - SECTIONS
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(SECTIONS))}")

    def want(section: str) -> bool:
        return not only or section in only

    rep = Report()
    started = time.time()
    overlay = Overlay(BASE_ROOTFS)
    warren = Warren(args.warren, args.agent, max(args.concurrent, args.list_sandboxes) + 20)
    try:
        create_p50 = None
        if want("create"):
            print("== create", flush=True)
            create_p50 = bench_create(rep, args.creates, overlay)
        if want("exec"):
            print("== exec round trip", flush=True)
            bench_exec(rep, args.execs)
        if want("files"):
            print("== files", flush=True)
            bench_files(rep, args.file_mib)
        if want("pause"):
            print("== pause/resume", flush=True)
            bench_pause_resume(rep, [10, 100, 500] if not args.quick else [10])
        if create_p50 is None and (want("fork") or want("density") or want("list")):
            create_p50 = create_p50_only(10)
        if want("fork"):
            print("== fork", flush=True)
            bench_fork(rep, 10 if not args.quick else 2, create_p50)
        running = []
        if want("density") or want("list"):
            print("== concurrent creates + density", flush=True)
            running = bench_concurrent_density(rep, args.concurrent, args.threads, create_p50, overlay)
        if want("list"):
            print("== list", flush=True)
            bench_list(rep, running, args.list_sandboxes, 100)
        kill_all(running)
        if want("interpreter"):
            print("== code interpreter", flush=True)
            bench_code_interpreter(rep, 10 if not args.quick else 2, create_p50)
    finally:
        warren.stop()
        overlay.cleanup()
        shutil.rmtree(warren.state, ignore_errors=True)
    table = print_table(rep)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = args.out / f"bench-{stamp}.json"
    out.write_text(json.dumps({"started": started, "seconds": time.time() - started,
                               "rows": [asdict(r) | {"ratio": r.ratio} for r in rep.rows],
                               "skipped": rep.skipped}, indent=2))
    (args.out / f"bench-{stamp}.txt").write_text(table + "\n")
    print(f"\nwrote {out} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
