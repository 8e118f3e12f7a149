#!/usr/bin/env bash
# needs: 10-apt
# A virtualenv with the official e2b SDK (pinned) for the SDK-driven tests.
set -euo pipefail
venv="$WARREN_REPO/.venv"
req="$WARREN_REPO/tests/sdk/requirements.txt"
stamp="$venv/.req-stamp"
# A venv whose creation was cut short (python there, pip not) is made again, not used half-built.
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/pip" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    "$venv/bin/pip" install -q -r "$req"
    cp "$req" "$stamp"
fi
