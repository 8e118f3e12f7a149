#!/usr/bin/env python3
"""Throughput and latency of warren-agent through the official e2b SDK, host mode, loopback.

    .venv/bin/python benches/agent_sdk.py [--mib 100] [--runs 200]

Uses the static agent from scripts/build-agent (or $WARREN_AGENT_BIN) and the SDK fixtures of
tests/sdk. Prints one line per measurement; bounded in size and count, loopback only.
"""

import argparse
import io
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "sdk"))
import conftest  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()

    agent = conftest.RunningAgent(conftest._agent_binary())
    try:
        sbx = agent.sandbox()
        payload = os.urandom(args.mib << 20)
        mb = len(payload) / 1e6

        t = time.perf_counter()
        sbx.files.write("/tmp/bench.bin", payload)
        up = time.perf_counter() - t
        t = time.perf_counter()
        sbx.files.write("/tmp/bench-stream.bin", io.BytesIO(payload))
        up_stream = time.perf_counter() - t
        t = time.perf_counter()
        back = sbx.files.read("/tmp/bench.bin", format="bytes")
        down = time.perf_counter() - t
        assert bytes(back) == payload, "downloaded bytes differ"

        # The SDK's HTTP client always accepts gzip, so the download above is compressed on the
        # fly (as envd does); this is the same file without content coding.
        import httpx

        t = time.perf_counter()
        with httpx.stream(
            "GET",
            f"{agent.url}/files",
            params={"path": "/tmp/bench.bin"},
            headers={"Accept-Encoding": "identity"},
        ) as r:
            got = sum(len(c) for c in r.iter_raw(1 << 20))
        down_identity = time.perf_counter() - t
        assert got == len(payload)

        print(f"upload   {args.mib} MiB (multipart):     {mb / up:8.1f} MB/s")
        print(f"upload   {args.mib} MiB (octet-stream):  {mb / up_stream:8.1f} MB/s")
        print(f"download {args.mib} MiB:                 {mb / down:8.1f} MB/s")
        print(f"download {args.mib} MiB (identity, httpx): {mb / down_identity:8.1f} MB/s")
        print(f"upload+download {args.mib} MiB:          {2 * mb / (up + down):8.1f} MB/s")

        sbx.commands.run("true")  # warm the connection
        samples = []
        for _ in range(args.runs):
            t = time.perf_counter()
            sbx.commands.run("true")
            samples.append((time.perf_counter() - t) * 1000)
        samples.sort()
        p50 = statistics.median(samples)
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(f'commands.run("true") x{args.runs}: p50 {p50:.2f} ms, p99 {p99:.2f} ms')
    finally:
        agent.stop()


if __name__ == "__main__":
    main()
