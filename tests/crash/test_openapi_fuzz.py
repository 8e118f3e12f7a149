"""The REST API fuzzed with schemathesis against the OpenAPI document it serves (issue 16): examples,
coverage, fuzzing and the stateful phase (links from a created sandbox to every operation on it), on a
`warren up` of its own in a private network namespace (the fuzzer calls everything, team and key
management included, so it must not share a server with other tests). No answer may be a 500 or 502,
break its documented schema or use an undocumented status code. `WARREN_API_FUZZ_EXAMPLES` raises
the number of examples per operation for a longer run (default 10, about a minute).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness

SCHEMATHESIS = harness.REPO / ".venv-schemathesis" / "bin" / "schemathesis"
HOOKS_DIR = harness.REPO / "tests" / "api-fuzz"
EXAMPLES = os.environ.get("WARREN_API_FUZZ_EXAMPLES", "10")


def test_the_api_keeps_its_openapi_document_under_fuzzing():
    reason = harness.missing_prerequisite()
    if reason is None and not SCHEMATHESIS.exists():
        reason = f"schemathesis is not installed at {SCHEMATHESIS} (run scripts/setup)"
    if reason:
        sys.__stderr__.write(f"SKIP: {reason}\n")
        pytest.skip(reason)
    warren = harness.Warren()
    try:
        warren.start()
        env = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "hooks",
            "PYTHONPATH": str(HOOKS_DIR),
        }
        run = subprocess.run(
            [
                str(SCHEMATHESIS),
                "run",
                f"{warren.api_url}/openapi.json",
                "--header",
                f"X-API-Key: {warren.api_key}",
                "--checks",
                "no_internal_error,response_schema_conformance,status_code_conformance,content_type_conformance",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                EXAMPLES,
                "--generation-deterministic",
                "--request-timeout",
                "60",
                # The fuzzer's own admin key must outlive the run: a revocation of it (an ID it can
                # read from GET /api-keys) would turn every later call into a 401.
                "--exclude-operation-id",
                "deleteApiKey",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(warren.state_dir).parent,
            timeout=900,
        )
        report = run.stdout[-20000:] + run.stderr[-3000:]
        assert run.returncode == 0, report
        assert "Stateful" in run.stdout, report
    finally:
        warren.cleanup()
