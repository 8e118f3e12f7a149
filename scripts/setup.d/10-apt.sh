#!/usr/bin/env bash
# Debian packages Warren and its tests use (lxcfs: sandboxes see their own limits in /proc, docs/operations.md).
set -euo pipefail
pkgs=(build-essential pkg-config python3-venv iproute2 nftables iptables e2fsprogs mmdebstrap procps psmisc curl ca-certificates lxcfs)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
