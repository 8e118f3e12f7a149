#!/usr/bin/env bash
# Debian packages Warren and its tests use (lxcfs: sandboxes see their own limits in /proc, docs/operations.md).
set -euo pipefail
pkgs=(build-essential pkg-config python3-venv iproute2 nftables iptables e2fsprogs mmdebstrap procps psmisc curl ca-certificates lxcfs
    # The DNS server the egress tests start in their own namespaces (no service is enabled).
    dnsmasq-base
    # The egress-proxy tests: a SOCKS5 server, and socat for its TLS front.
    microsocks socat
    # Image-pull tests: a real registry on loopback, skopeo to push test images, a static busybox for
    # an Alpine-like image, zstd for zstd layers (the registry's system service is never enabled).
    docker-registry skopeo umoci busybox-static zstd
    # The dashboard's browser tests (tests/e2e/test_dashboard_e2e.py) drive headless Chromium.
    chromium
    # The store's tests on PostgreSQL (and tests/crash/test_postgres_restart.py) start their own private
    # cluster with initdb/postgres in a temp dir (docs/cluster.md); the packaged service is not wanted.
    postgresql)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# Tests start their own registries on free loopback ports; the packaged service is not wanted.
if [ -d /run/systemd/system ] && systemctl is-enabled docker-registry >/dev/null 2>&1; then
    systemctl disable --now docker-registry || true
fi
if [ -d /run/systemd/system ] && systemctl is-enabled postgresql >/dev/null 2>&1; then
    systemctl disable --now postgresql || true
fi
