#!/usr/bin/env python3
"""Load: many clients create and kill sandboxes at once while one more client times command round
trips in a sandbox that lives through it all (issue 16).

`run_load` is the whole measurement and is shared: `scripts/load-test` runs it long (1,000 sandboxes
by 50 clients, on a `warren up` of its own) and prints the figures; tests/e2e/test_load_e2e.py runs a
short version against the suite's server and checks the part that is not about speed: every failed
call was a documented 429 or 507 (a server at capacity) and no round trip failed. The exec figures are a benchmark (p99 under load
against p99 idle, same run), never a timed assertion.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, asdict
from pathlib import Path


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


@dataclass
class LoadResult:
    sandboxes: int
    clients: int
    created: int = 0
    killed: int = 0
    refused_429: int = 0
    refused_507: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exec_idle_ms: list[float] = field(default_factory=list)
    exec_loaded_ms: list[float] = field(default_factory=list)
    exec_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        idle99, loaded99 = pct(self.exec_idle_ms, 99), pct(self.exec_loaded_ms, 99)
        return {
            "sandboxes": self.sandboxes,
            "clients": self.clients,
            "created": self.created,
            "killed": self.killed,
            "refused_429": self.refused_429,
            "refused_507": self.refused_507,
            "errors": len(self.errors),
            "seconds": round(self.seconds, 1),
            "creates_per_s": round(self.created / self.seconds, 1) if self.seconds else None,
            "exec_idle_p50_ms": round(pct(self.exec_idle_ms, 50), 1),
            "exec_idle_p99_ms": round(idle99, 1),
            "exec_loaded_p50_ms": round(pct(self.exec_loaded_ms, 50), 1),
            "exec_loaded_p99_ms": round(loaded99, 1),
            "exec_p99_ratio": round(loaded99 / idle99, 2) if idle99 else None,
            "exec_samples_loaded": len(self.exec_loaded_ms),
            "exec_errors": len(self.exec_errors),
        }


# The documented answers of a server at capacity: 429 (its sandbox limit) and 507 (the state disk's
# room for writable layers, which admission keeps for every running sandbox). A create refused so is
# tried again; any other failure is an error.
CAPACITY = (429, 507)


def _status(error: Exception) -> int | None:
    """The HTTP status of an SDK exception: the SDK names 429 RateLimitException and puts the status
    first in the message of the others ("507: insufficient storage: ...")."""
    from e2b.exceptions import RateLimitException

    if isinstance(error, RateLimitException):
        return 429
    head = str(error).split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


def _probe(template: str, bound_s: float, idle_samples: int, ready, stop, out) -> None:
    """The exec client, in a process of its own so that the load clients' threads cannot hold it up
    (they share one interpreter lock): creates its sandbox, times `idle_samples` round trips, says
    it is ready, times round trips until told to stop, and sends back (idle, loaded, errors)."""
    from e2b import Sandbox

    idle, loaded, errors = [], [], []
    probe = Sandbox.create(template=template, timeout=int(bound_s) + 300, metadata={"load": "1"})
    try:
        probe.commands.run("true")  # the first call opens the connection; not a sample
        for _ in range(idle_samples):
            start = time.perf_counter()
            probe.commands.run("true")
            idle.append((time.perf_counter() - start) * 1000)
        ready.set()
        while not stop.is_set():
            start = time.perf_counter()
            try:
                probe.commands.run("true", timeout=60)
            except Exception as error:  # noqa: BLE001 - every failure is counted and reported
                errors.append(repr(error)[:300])
                continue
            loaded.append((time.perf_counter() - start) * 1000)
    except Exception as error:  # noqa: BLE001
        errors.append(f"probe: {error!r}"[:300])
    finally:
        ready.set()
        try:
            probe.kill()
        except Exception as error:  # noqa: BLE001
            errors.append(f"probe kill: {error!r}"[:300])
        out.put((idle, loaded, errors))


def run_load(sandboxes: int, clients: int, idle_samples: int = 50, bound_s: float = 1800,
             template: str = "base") -> LoadResult:
    """Creates and kills `sandboxes` sandboxes from `clients` threads (each creates one, runs nothing,
    kills it, and goes on) while a probe process runs `true` in a sandbox of its own in a loop."""
    import multiprocessing

    from e2b import Sandbox

    result = LoadResult(sandboxes=sandboxes, clients=clients)
    lock = threading.Lock()
    remaining = [sandboxes]
    deadline = time.monotonic() + bound_s
    # Spawned, not forked: a fork copies the locks other threads hold (the test runner's log
    # readers), and the probe then hung before its first call. The SDK reads its settings from the
    # environment, which the child inherits.
    context = multiprocessing.get_context("spawn")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    prober = context.Process(target=_probe, args=(template, bound_s, idle_samples, ready, stop, out))
    prober.start()
    ready.wait(timeout=300)

    def client():
        while time.monotonic() < deadline:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            try:
                sandbox = Sandbox.create(template=template, timeout=300, metadata={"load": "1"})
            except Exception as error:  # noqa: BLE001
                status = _status(error)
                with lock:
                    if status in CAPACITY:
                        if status == 429:
                            result.refused_429 += 1
                        else:
                            result.refused_507 += 1
                        remaining[0] += 1  # a refused create is tried again
                    else:
                        result.errors.append(f"create: {error!r}"[:300])
                if status in CAPACITY:
                    time.sleep(0.05)
                continue
            with lock:
                result.created += 1
            try:
                sandbox.kill()
                with lock:
                    result.killed += 1
            except Exception as error:  # noqa: BLE001
                with lock:
                    result.errors.append(f"kill {sandbox.sandbox_id}: {error!r}"[:300])

    workers = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=max(1.0, deadline - time.monotonic()))
    result.seconds = time.monotonic() - started
    stop.set()
    try:
        result.exec_idle_ms, result.exec_loaded_ms, result.exec_errors = out.get(timeout=180)
    except Exception:  # noqa: BLE001 - the probe's silence is itself the failure
        result.exec_errors.append("the probe process sent no samples")
    prober.join(timeout=60)
    if any(worker.is_alive() for worker in workers):
        result.errors.append(f"clients still running after {bound_s} s")
    return result


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run as bench  # the benchmark harness's `warren up`

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warren", type=Path, required=True)
    parser.add_argument("--agent", type=Path, required=True)
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--bound-s", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    # Room for every client's sandbox and the probe, and no more: a client past the limit is a 429.
    warren = bench.Warren(args.warren, args.agent, max_sandboxes=args.clients + 1)
    try:
        result = run_load(args.sandboxes, args.clients, bound_s=args.bound_s)
    finally:
        warren.stop()
    if not result.errors and not result.exec_errors:
        shutil.rmtree(warren.state, ignore_errors=True)  # kept for its log when something failed
    else:
        print(f"state and log kept in {warren.state}")
    figures = result.summary()
    print(json.dumps(figures, indent=1))
    for error in (result.errors + result.exec_errors)[:20]:
        print(f"error: {error}")
    if args.json:
        args.json.write_text(json.dumps({**figures, "raw": asdict(result)}, indent=1))
    return 0 if not result.errors and not result.exec_errors else 1


if __name__ == "__main__":
    sys.exit(main())
