#!/usr/bin/env python3
"""Cluster mode's cost (issue 21): create latency through a server whose sandboxes run on 1, 2 or 3
`warren node`s, each node in a network namespace of its own (test-owned 198.18.x addresses, no
default route), against the same machine's `warren up` with no nodes, in the same run.

Run inside scripts/private-netns, with the release binary:

    WARREN_BIN=target/release/warren scripts/private-netns .venv/bin/python benches/cluster.py [--creates N] [--json F]
    ... benches/cluster.py --migrate 10     # a sandbox holding 100 MiB moved between 2 nodes 10 times
    ... benches/cluster.py --many 500       # 500 sandboxes held at once over 3 nodes
    ... benches/cluster.py --servers        # one server on SQLite, then two on PostgreSQL, 2 nodes

Each configuration: a fresh server (and nodes), 5 creates to warm up, then N sequential creates
(`POST /sandboxes`, each killed after) for p50/p99, then N creates by 4 clients at once for the rate.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "crash"))
sys.path.insert(0, str(REPO / "tests" / "cluster"))

import harness  # noqa: E402
import test_node as cluster  # noqa: E402
import test_servers  # noqa: E402


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def create_and_kill(warren) -> float:
    started = time.perf_counter()
    status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
    took = (time.perf_counter() - started) * 1000
    if status != 201:
        raise RuntimeError(f"create answered {status}: {body}")
    warren.api("DELETE", f"/sandboxes/{body['sandboxID']}")
    return took


def measure(warren, creates: int) -> dict:
    for _ in range(5):
        create_and_kill(warren)
    latencies = [create_and_kill(warren) for _ in range(creates)]
    done, errors = [], []

    def client(count: int):
        for _ in range(count):
            try:
                done.append(create_and_kill(warren))
            except Exception as error:  # noqa: BLE001 - counted and reported
                errors.append(str(error))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(creates // 4,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {
        "create_p50_ms": round(pct(latencies, 50), 1),
        "create_p99_ms": round(pct(latencies, 99), 1),
        "create_and_kill_per_s_4_clients": round(len(done) / seconds, 1),
        "errors": len(errors),
    }


HOLD_100_MIB = "python3 -c 'import time; b = bytearray(100 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(10 ** 6)'"


def measure_migration(warren, rounds: int) -> dict:
    """A sandbox holding 100 MiB moved back and forth between the nodes, `rounds` times: the time
    of `POST /migrate` (checkpoint, then restore on the other node) and of migrate then a first
    command."""
    from e2b import Sandbox

    box = Sandbox.create(timeout=3600)
    box.commands.run(HOLD_100_MIB, background=True)
    time.sleep(2)  # the memory is touched
    migrate_ms, first_command_ms = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        status, body = warren.api("POST", f"/sandboxes/{box.sandbox_id}/migrate")
        migrated = time.perf_counter()
        if status != 200:
            raise RuntimeError(f"migrate answered {status}: {body}")
        Sandbox.connect(box.sandbox_id).commands.run("true")
        done = time.perf_counter()
        migrate_ms.append((migrated - started) * 1000)
        first_command_ms.append((done - started) * 1000)
    box.kill()
    return {
        "migrate_100mib_p50_ms": round(pct(migrate_ms, 50), 1),
        "migrate_100mib_max_ms": round(max(migrate_ms), 1),
        "migrate_to_first_command_p50_ms": round(pct(first_command_ms, 50), 1),
    }


def measure_many(warren, total: int) -> dict:
    """`total` sandboxes held at once, created by 8 clients; then all killed."""
    ids, errors = [], []
    lock = threading.Lock()

    def client(count: int):
        for _ in range(count):
            status, body = warren.api("POST", "/sandboxes", {"templateID": "base", "timeout": 3600})
            with lock:
                (ids.append(body["sandboxID"]) if status == 201 else errors.append(f"{status}: {body}"))

    started = time.perf_counter()
    shares = [total // 8 + (1 if i < total % 8 else 0) for i in range(8)]
    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    status, nodes = warren.api("GET", "/nodes")
    spread = {node["nodeID"]: node["sandboxes"] for node in nodes} if status == 200 else {}
    for sandbox_id in ids:
        warren.api("DELETE", f"/sandboxes/{sandbox_id}")
    return {
        "held_at_once": len(ids),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "create_per_s_8_clients": round(len(ids) / seconds, 1),
        "per_node": spread,
    }


def measure_exec(opts: dict, rounds: int = 100) -> dict:
    """`commands.run("true")` round trips through the server `opts` names (the SDK's options)."""
    box = harness.sdk().create(timeout=600, **opts)
    try:
        for _ in range(10):
            box.commands.run("true")
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            box.commands.run("true")
            took.append((time.perf_counter() - started) * 1000)
    finally:
        box.kill()
    return {"exec_p50_ms": round(pct(took, 50), 2), "exec_p99_ms": round(pct(took, 99), 2)}


def with_servers(creates: int) -> dict:
    """Two nodes; one server on SQLite, then two on one PostgreSQL database (each measured)."""
    state = Path(tempfile.mkdtemp(prefix="wt-cluster-bench-"))
    nodes, made, results = [], [], {}
    try:
        cluster.start_nodes(nodes, made, [[], []], state, name="wt-bench", lan="wt-lan", octet=10, subnet=81)
        alone = cluster.RemoteCluster(nodes, state)
        alone.start()
        try:
            results["one server, SQLite"] = {**measure(alone, creates), **measure_exec(
                {"api_url": alone.api_url, "sandbox_url": alone.sandbox_url, "api_key": alone.api_key})}
        finally:
            alone.stop()
            harness.drop_log(alone.log_path)
        (state / "warren.db").unlink(missing_ok=True)
        with harness.private_postgres() as database:
            a, b = (test_servers.SharedServer(state, nodes, database, name) for name in ("a", "b"))
            try:
                test_servers.start_both(a, b)
                for label, server in (("two servers, PostgreSQL: the leader", a), ("two servers, PostgreSQL: the other", b)):
                    results[label] = {**measure(server, creates), **measure_exec(server.sdk())}
            finally:
                for server in (a, b):
                    server.stop()
                    server.log_path.unlink(missing_ok=True)
        return results
    finally:
        cluster.stop_nodes(nodes, made)
        subprocess.run(["rm", "-rf", "--one-file-system", str(state)], check=False)


def with_nodes(count: int, creates: int, only: str | None = None, amount: int = 0) -> dict:
    server_state = Path(tempfile.mkdtemp(prefix="wt-cluster-bench-"))
    nodes, made = [], []
    warren = None
    # Each node's own limits too (`warren node --max-*`) for `many`.
    limits = (["--max-sandboxes", str(amount + 16), "--max-total-memory-mib", str(2048 * (amount + 16)),
               "--max-total-vcpus", str(4 * (amount + 16))] if only == "many" else [])
    try:
        cluster.start_nodes(nodes, made, [limits] * count, server_state, name="wt-bench", lan="wt-lan", octet=10,
                            subnet=81)
        warren = cluster.RemoteCluster(nodes, server_state) if nodes else harness.Warren(server_state)
        if only == "many":
            # The server's own limits would refuse long before the machine is full.
            command = warren._command
            warren._command = lambda: command() + [
                "--max-sandboxes", str(amount + 16), "--max-total-memory-mib", str(2048 * (amount + 16)),
                "--max-total-vcpus", str(4 * (amount + 16)), "--sandbox-disk-mib", "256",
                "--disk-overcommit", "20", "--sandbox-max-pids", "256",
            ]
        warren.start()
        if only == "migrate":
            return measure_migration(warren, amount)
        if only == "many":
            return measure_many(warren, amount)
        return measure(warren, creates)
    finally:
        if warren is not None:
            warren.cleanup()
        cluster.stop_nodes(nodes, made)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", type=int, default=40)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--migrate", type=int, metavar="ROUNDS", help="only: a 100 MiB sandbox migrated ROUNDS times between 2 nodes")
    parser.add_argument("--many", type=int, metavar="N", help="only: N sandboxes held at once over 3 nodes")
    parser.add_argument("--servers", action="store_true",
                        help="only: one server on SQLite, then two sharing PostgreSQL, over 2 nodes")
    args = parser.parse_args()
    reason = harness.missing_prerequisite()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    if args.servers:
        if harness.pg_bin() is None:
            print("SKIP: no PostgreSQL binaries (install postgresql)")
            return 0
        results = with_servers(args.creates)
        for label, result in results.items():
            print(f"{label:40} {json.dumps(result)}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    if args.migrate or args.many:
        result = (
            with_nodes(2, 0, "migrate", args.migrate) if args.migrate else with_nodes(3, 0, "many", args.many)
        )
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    results = {}
    for count in (0, 1, 2, 3):
        label = "no nodes (warren up alone)" if count == 0 else f"{count} node(s)"
        results[label] = with_nodes(count, args.creates)
        print(f"{label:28} {json.dumps(results[label])}", flush=True)
    base = results["no nodes (warren up alone)"]["create_p50_ms"]
    for label, result in results.items():
        result["p50_vs_no_nodes"] = round(result["create_p50_ms"] / base, 2)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
