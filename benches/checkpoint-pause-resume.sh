#!/usr/bin/env bash
# Pause/resume times of a sandbox with 10, 100 and 500 MiB resident (CRIU checkpoints through the Linux
# runtime). Needs root, CRIU (scripts/setup) and the base rootfs. Env: WARREN_BENCH_MIB, WARREN_BENCH_REPEAT,
# WARREN_BENCH_FILL=random|text (see crates/runtime/benches/checkpoint_pause_resume.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench -p warren-runtime --bench checkpoint_pause_resume "$@"
