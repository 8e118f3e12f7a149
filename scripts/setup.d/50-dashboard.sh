#!/usr/bin/env bash
# needs: 10-apt
# The web dashboard's bundle (dashboard/dist), which the server embeds when it is compiled (build.rs).
# Without npm the server still builds and /dashboard answers 503 saying so.
set -euo pipefail
dir="$WARREN_REPO/dashboard"
if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: npm not installed; /dashboard will answer 503 until the bundle is built"
    exit 0
fi
stamp="$dir/node_modules/.lock-stamp"
if [ ! -f "$stamp" ] || ! cmp -s "$dir/package-lock.json" "$stamp"; then
    (cd "$dir" && npm ci --silent --no-audit --no-fund)
    cp "$dir/package-lock.json" "$stamp"
fi
(cd "$dir" && npm run --silent build)
