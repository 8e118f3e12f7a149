#!/usr/bin/env bash
# needs: 10-apt
# schemathesis (pinned) for the REST API fuzz run against the served OpenAPI document, in a virtualenv
# of its own: it needs a newer pytest than the SDK tests pin.
set -euo pipefail
venv="$WARREN_REPO/.venv-schemathesis"
req="$WARREN_REPO/tests/api-fuzz/requirements.txt"
stamp="$venv/.req-stamp"
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/pip" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    "$venv/bin/pip" install -q -r "$req"
    cp "$req" "$stamp"
fi
