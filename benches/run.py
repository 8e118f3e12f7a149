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
    def verdict(self) -> str:
        """`pass` or `miss` against the target (`<= 30 ms`, `>= 300 MB/s`, ...) when it has a bound in
        the row's own unit, else empty."""
        parts = self.target.split()
        if len(parts) < 3 or parts[0] not in ("<", "<=", ">", ">=") or parts[2] != self.unit:
            return ""
        try:
            bound = float(parts[1])
        except ValueError:
            return ""
        if self.value != self.value:
            return "miss"
        ok = {"<": self.value < bound, "<=": self.value <= bound,
              ">": self.value > bound, ">=": self.value >= bound}[parts[0]]
        return "pass" if ok else "miss"

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

    def __init__(self, warren_bin: Path, agent_bin: Path, max_sandboxes: int, pids: int = 256, disk_mib: int = 160,
                 extra: tuple[str, ...] = ()):
        self.state = Path(tempfile.mkdtemp(prefix="warren-bench-"))
        self.bin, self.agent = warren_bin, agent_bin
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
               # host's real task ceiling and free disk: keep both small enough for the density runs.
               "--sandbox-max-pids", str(pids), "--sandbox-disk-mib", str(disk_mib), *extra]
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
        # `warren down --kill-sandboxes` stops the server, then kills every sandbox of its state
        # directory, a template build's too (`warren up` builds the code-interpreter template at
        # start), and detaches its lxcfs mount.
        down = subprocess.run([str(self.bin), "down", "--state-dir", str(self.state / "state"), "--kill-sandboxes",
                               "--agent", str(self.agent)], stdout=self.log, stderr=self.log, check=False)
        if down.returncode != 0:
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
# The same template under a second name, which the main server keeps a warm pool of.
POOLED_TEMPLATE = "bench-running-pooled"
POOL_SIZE = 3


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
                "unshare+overlay p50", "<= 15 ms"))
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
        bench_warm_pool(rep, n, p50f)
    return pct(samples, 50)


def pool_size(reference: str) -> int:
    import httpx
    text = httpx.get(f"{os.environ['E2B_API_URL']}/metrics",
                     headers={"X-API-Key": os.environ["E2B_API_KEY"]}, timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'warren_warm_pool_sandboxes{{template="{reference}"}}'):
            return int(float(line.split()[-1]))
    return 0


def bench_warm_pool(rep: Report, n: int, floor_p50: float | None) -> None:
    """Creates from a template with a warm pool (`--warm-pool`), each taken from a full pool: what a
    create costs when the pool keeps up (its refill rate is a restore's)."""
    from e2b import Sandbox, Template, wait_for_port
    template = (Template().from_image("debian:bookworm")
                .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000)))
    Template.build(template, alias=POOLED_TEMPLATE)
    Sandbox.create(template=POOLED_TEMPLATE, timeout=60).kill()  # also wakes the pool's filler
    samples = []
    for _ in range(n):
        deadline = time.monotonic() + 60
        while pool_size(POOLED_TEMPLATE) < POOL_SIZE:
            if time.monotonic() > deadline:
                rep.skip("create from a warm pool", f"the pool did not fill to {POOL_SIZE} in 60 s")
                return
            time.sleep(0.05)
        t0 = time.perf_counter()
        sbx = Sandbox.create(template=POOLED_TEMPLATE, timeout=120)
        sbx.commands.run("true")
        samples.append((time.perf_counter() - t0) * 1000)
        sbx.kill()
    rep.add(Row("create -> first command p50 (running-state template, warm pool)", pct(samples, 50), "ms",
                floor_p50, "unshare+overlay p50", "<= 30 ms",
                note=f"--warm-pool {POOLED_TEMPLATE}={POOL_SIZE}; each create from a full pool"))


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


def bash_starts_inside(sbx, n: int) -> list[float]:
    """Milliseconds each of n `bash -l -c true` starts takes inside the sandbox, timed in there."""
    script = ("import json, subprocess, time\n"
              "out = []\n"
              f"for _ in range({n}):\n"
              "    t0 = time.perf_counter()\n"
              "    subprocess.run(['/bin/bash', '-l', '-c', 'true'], check=True)\n"
              "    out.append((time.perf_counter() - t0) * 1000)\n"
              "print(json.dumps(out))\n")
    sbx.files.write("/tmp/bash-starts.py", script)
    return json.loads(sbx.commands.run("python3 /tmp/bash-starts.py").stdout)


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
        starts = bash_starts_inside(sbx, n)
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
    # Warren's own share of a command: the bare call less what is not Warren's, both from this run:
    # starting `bash -l -c true` inside the sandbox (timed in there) and one loopback HTTP exchange.
    share = pct(bare, 50) - pct(starts, 50) - pct(base, 50)
    rep.add(Row("Warren's share of commands.run('true') p50", share, "ms", pct(starts, 50),
                "bash -l -c true started inside the sandbox, p50", "<= 0.5 ms",
                note="bare Connect call p50 - in-sandbox bash start p50 - loopback echo p50"))


def curl_download_rate(rep: Report, sbx, path: str, size: int) -> float | None:
    """MB/s of the best of three downloads of `path` by curl through the proxy, the Python client's
    own costs (allocating and joining the body) left out."""
    if shutil.which("curl") is None:
        rep.skip("download via curl", "no curl on this machine")
        return None
    headers = dict(sbx.connection_config.sandbox_headers)
    headers["Authorization"] = "Basic " + base64.b64encode(b"user:").decode()
    url = f"{sbx.envd_api_url}/files?path={path}"
    args = ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", url]
    for key, value in headers.items():
        args += ["-H", f"{key}: {value}"]
    best = None
    for _ in range(3):
        got, seconds = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()
        if int(got) != size:
            raise RuntimeError(f"curl downloaded {got} bytes of {size}")
        rate = size / 1e6 / float(seconds)
        best = rate if best is None else max(best, rate)
    return best


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
        curl_rate = curl_download_rate(rep, sbx, "/home/user/blob", len(data))
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
    if curl_rate is not None:
        rep.add(Row(f"download {mib} MiB via curl (Warren's side)", curl_rate, "MB/s", cp_rate, "cp MB/s",
                    ">= 1000 MB/s", note="the same GET the SDK sends, read by curl into /dev/null"))


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
                    f"write+fsync {mib} MiB",
                    {100: "<= 50 ms for 100 MiB", 500: "<= 150 ms for 500 MiB"}.get(mib, "")))


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

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(threads) as pool:
        made = [s for s in pool.map(one, range(total)) if s is not None]
    wall_s = time.perf_counter() - t0
    rep.add(Row(f"{total} creates from {threads} threads p99", pct(samples, 99), "ms", create_p50,
                "sequential create p50", "<= 300 ms",
                note=f"{len(errors)} errors" + (f" ({errors[0]})" if errors else "")))
    # Sustained throughput: the creates that succeeded over the batch's wall time, against one
    # client creating one after another.
    rep.add(Row(f"{total} creates from {threads} threads, creates/s", len(samples) / wall_s, "/s",
                1000 / create_p50 if create_p50 else None, "sequential creates/s (1000 / p50)", ">= 60/s",
                note=f"{wall_s:.1f} s wall; p50 {pct(samples, 50):.0f} ms"))
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


# A thousand idle sandboxes on one host: admission holds each one's task limit and whole writable
# layer against the host's task ceiling (threads-max less a reserve: ~170,000 tasks here) and the
# state disk's free space (less a twentieth of the disk), so the server of the list benchmarks gives
# each sandbox 64 tasks and a 16 MiB disk (the smallest the runtime makes), not the 256 and 160 MiB
# the other sections use.
MANY_PIDS, MANY_DISK_MIB = 64, 16


def fill_to(want: int, threads: int = 8) -> list:
    """`want` running sandboxes of the base template, made from `threads` threads. A failed create is
    printed and tried again, three rounds at most; the rows say how many ran."""
    from e2b import Sandbox
    made: list = []
    errors: list[str] = []

    def one(_):
        try:
            return Sandbox.create(template="base", timeout=3600)
        except Exception as err:  # noqa: BLE001 - counted and printed
            errors.append(f"{type(err).__name__}: {err}")
            return None

    for _ in range(3):
        with cf.ThreadPoolExecutor(threads) as pool:
            made += [s for s in pool.map(one, range(want - len(made))) if s is not None]
        if len(made) >= want:
            break
        print(f"  {want - len(made)} creates failed, trying again; first error: {errors[0]}", flush=True)
    return made


def kill_everything() -> None:
    """Kills every sandbox the server still lists (what a failed kill or create left behind)."""
    import httpx
    headers = {"X-API-Key": os.environ["E2B_API_KEY"]}
    api = os.environ["E2B_API_URL"]
    with httpx.Client(headers=headers, timeout=60) as client:
        left, token = [], None
        while True:
            params = {"state": "running,paused", "limit": 100} | ({"nextToken": token} if token else {})
            page = client.get(f"{api}/v2/sandboxes", params=params)
            page.raise_for_status()
            left += page.json()
            token = page.headers.get("x-next-token")
            if not token:
                break
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: _quiet(lambda: client.delete(f"{api}/sandboxes/{s['sandboxID']}")), left))


def disk_used(path: Path) -> int:
    """Bytes of disk `path` takes (allocated blocks, so sparse layers count for what they hold)."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def fill_paused(rep: Report, want: int, state: Path, threads: int = 4) -> int:
    """`want` more sandboxes, each paused to a checkpoint once up (what paused ones cost: disk, no
    memory); adds the disk row and returns how many were paused."""
    from e2b import Sandbox
    if want <= 0:
        return 0
    done, errors = [], []

    def one(_):
        try:
            sbx = Sandbox.create(template="base", timeout=3600)
            sbx.beta_pause()
            done.append(sbx.sandbox_id)
        except Exception as err:  # noqa: BLE001 - counted and printed
            errors.append(f"{type(err).__name__}: {err}")

    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(want)))
    if errors:
        print(f"  {len(errors)} of {want} creates or pauses failed; first error: {errors[0]}", flush=True)
    print(f"  {len(done)} sandboxes paused", flush=True)
    if done:
        # Everything the state directory keeps under each paused sandbox's ID.
        used = sum(disk_used(path) for sid in done[:50] for path in state.glob(f"state/**/{sid}"))
        rep.add(Row("disk per paused sandbox (checkpoint + writable layer)", used / min(len(done), 50) / 2**20,
                    "MiB", None, "", note=f"mean of {min(len(done), 50)} of {len(done)} paused; no memory held"))
    return len(done)


def timed_gets(path: str, params: dict, n: int):
    """Milliseconds of n `GET path` and of n `GET /health` (the baseline) with the API key, and the
    last answer's JSON."""
    import httpx
    headers = {"X-API-Key": os.environ["E2B_API_KEY"]}
    api = os.environ["E2B_API_URL"]
    samples, base = [], []
    with httpx.Client(headers=headers, timeout=60) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.get(f"{api}{path}", params=params)
            samples.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
        for _ in range(n):
            t0 = time.perf_counter()
            client.get(f"{api}/health")
            base.append((time.perf_counter() - t0) * 1000)
    return samples, base, r.json()


def bench_list_all(rep: Report, running: int, paused: int, n: int) -> None:
    """A page of `GET /v2/sandboxes?state=running,paused` (100 rows, the largest page) with every
    running and paused sandbox in the table: what a client paging through them waits per request."""
    samples, base, _ = timed_gets("/v2/sandboxes", {"state": "running,paused", "limit": 100}, n)
    rep.add(Row(f"GET /v2/sandboxes page p99 with {running + paused} sandboxes", pct(samples, 99), "ms",
                pct(base, 99), "GET /health p99", "<= 50 ms",
                note=f"{running} running, {paused} paused; state=running,paused, 100 a page"))


def bench_list(rep: Report, count: int, n: int) -> None:
    samples, base, listed = timed_gets("/sandboxes", {}, n)
    rep.add(Row(f"GET /sandboxes p99 with {len(listed)} sandboxes", pct(samples, 99), "ms", pct(base, 99),
                "GET /health p99", "<= 50 ms", note=f"{count} running"))


def bench_dashboard(rep: Report, count: int, loads: int) -> None:
    """The dashboard's sandbox list page with `count` real sandboxes, in headless Chromium
    (dashboard/tests/list-bench.mjs): navigation to rows drawn, in fresh browser contexts."""
    chromium = os.environ.get("WARREN_CHROMIUM", "/usr/bin/chromium")
    dashboard = REPO / "dashboard"
    if not Path(chromium).is_file() or shutil.which("node") is None:
        rep.skip("dashboard list page", f"needs node and Chromium at {chromium} (scripts/setup)")
        return
    if not (dashboard / "node_modules" / "playwright-core").is_dir():
        rep.skip("dashboard list page", "dashboard/node_modules missing (scripts/setup)")
        return
    done = subprocess.run(
        ["node", "tests/list-bench.mjs"], cwd=dashboard, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "WARREN_URL": os.environ["E2B_API_URL"], "WARREN_KEY": os.environ["E2B_API_KEY"],
             "EXPECT": str(count), "LOADS": str(loads), "CHROMIUM": chromium})
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        rep.skip("dashboard list page", f"list-bench.mjs exited {done.returncode}: {(done.stderr or done.stdout)[-500:]}")
        return
    result = json.loads(found[-1].split(" ", 1)[1])
    rep.add(Row(f"dashboard list page, {count} sandboxes: navigation -> rows drawn p50", pct(result["loads"], 50),
                "ms", pct(result["fetches"], 50), "its /v2/sandboxes pages fetched p50", "< 1000 ms",
                note=f"max {max(result['loads']):.0f} ms over {loads} cold loads; {result['rows']} rows in the DOM"))


# ------------------------------------------------------------------------------------------------ main


def print_table(rep: Report) -> str:
    lines = [f"{'figure':58} {'value':>12} {'baseline':>12} {'ratio':>8}  {'met':4}  target",
             "-" * 116]
    for r in rep.rows:
        base = f"{r.baseline:.3f}" if r.baseline is not None else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append(f"{r.name:58} {r.value:>9.3f} {r.unit:<3}{base:>12} {ratio:>8}  {r.verdict:4}  {r.target}"
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


SECTIONS = {"create", "exec", "files", "pause", "fork", "density", "list", "dashboard", "interpreter"}


def run_sections(args, want, rep: Report, overlay: Overlay) -> None:
    """Every section but the 1,000-sandbox ones, against one `warren up`."""
    warren = Warren(args.warren, args.agent, args.concurrent + 20,
                    extra=("--warm-pool", f"{POOLED_TEMPLATE}={POOL_SIZE}"))
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
        if create_p50 is None and (want("fork") or want("density")):
            create_p50 = create_p50_only(10)
        if want("fork"):
            print("== fork", flush=True)
            bench_fork(rep, 10 if not args.quick else 2, create_p50)
        if want("density"):
            print("== concurrent creates + density", flush=True)
            kill_all(bench_concurrent_density(rep, args.concurrent, args.threads, create_p50, overlay))
        if want("interpreter"):
            print("== code interpreter", flush=True)
            bench_code_interpreter(rep, 10 if not args.quick else 2, create_p50)
    finally:
        warren.stop()
        shutil.rmtree(warren.state, ignore_errors=True)


def run_many(args, want, rep: Report) -> None:
    """The list and dashboard sections: `--list-sandboxes` running sandboxes on a server of their own
    (small disks and task limits, see MANY_PIDS), all killed after."""
    print(f"== {args.list_sandboxes} sandboxes: list and dashboard", flush=True)
    warren = Warren(args.warren, args.agent, args.list_sandboxes + args.paused_sandboxes + 20, MANY_PIDS,
                    MANY_DISK_MIB)
    try:
        made = fill_to(args.list_sandboxes)
        print(f"  {len(made)} of {args.list_sandboxes} sandboxes running", flush=True)
        if want("list"):
            bench_list(rep, len(made), 100)
        if want("dashboard"):
            bench_dashboard(rep, len(made), args.dashboard_loads)
        if want("list"):
            at_count = create_samples(min(args.creates, 20), first_command=True)
            rep.add(Row(f"create -> first command p50 with {len(made)} running", pct(at_count, 50), "ms", None,
                        "", "<= 30 ms"))
            paused = fill_paused(rep, args.paused_sandboxes, warren.state)
            if paused:
                bench_list_all(rep, len(made), paused, 100)
        kill_all(made)
    finally:
        kill_everything()
        warren.stop()
        shutil.rmtree(warren.state, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warren", type=Path, required=True, help="the warren binary (release build)")
    ap.add_argument("--agent", type=Path, required=True, help="the static warren-agent binary")
    ap.add_argument("--out", type=Path, default=REPO / "benches/results", help="where the JSON goes")
    ap.add_argument("--creates", type=int, default=200)
    ap.add_argument("--execs", type=int, default=500)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--threads", type=int, default=20)
    ap.add_argument("--list-sandboxes", type=int, default=1000,
                    help="running sandboxes for the list and dashboard sections")
    ap.add_argument("--paused-sandboxes", type=int, default=2000,
                    help="sandboxes paused beside the running ones for the list section (0: none)")
    ap.add_argument("--dashboard-loads", type=int, default=5, help="page loads the dashboard section times")
    ap.add_argument("--file-mib", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated sections to run "
                    "(create,exec,files,pause,fork,density,list,dashboard,interpreter); default: all")
    args = ap.parse_args()
    if args.quick:
        args.creates, args.execs, args.concurrent, args.threads, args.list_sandboxes = 10, 50, 20, 5, 40
        args.paused_sandboxes = 20
        args.file_mib, args.dashboard_loads = 16, 2
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
    try:
        if any(want(section) for section in SECTIONS - {"list", "dashboard"}):
            run_sections(args, want, rep, overlay)
        if want("list") or want("dashboard"):
            run_many(args, want, rep)
    finally:
        overlay.cleanup()
    table = print_table(rep)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = args.out / f"bench-{stamp}.json"
    out.write_text(json.dumps({"started": started, "seconds": time.time() - started,
                               "rows": [asdict(r) | {"ratio": r.ratio, "verdict": r.verdict} for r in rep.rows],
                               "skipped": rep.skipped}, indent=2))
    (args.out / f"bench-{stamp}.txt").write_text(table + "\n")
    print(f"\nwrote {out} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
