#!/usr/bin/env bash
# needs: 10-apt
# The official e2b JS SDK (pinned in tests/sdk/js/package-lock.json) for tests/sdk/test_js_sdk.py.
# Skipped, with a note, where Node is not installed.
set -euo pipefail
dir="$WARREN_REPO/tests/sdk/js"
if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: npm not installed; the JS SDK test will skip"
    exit 0
fi
stamp="$dir/node_modules/.lock-stamp"
if [ ! -f "$stamp" ] || ! cmp -s "$dir/package-lock.json" "$stamp"; then
    (cd "$dir" && npm ci --silent --no-audit --no-fund)
    cp "$dir/package-lock.json" "$stamp"
fi
