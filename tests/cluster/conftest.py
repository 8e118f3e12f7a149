"""Cluster tests reuse the crash harness (a real `warren up` on a state dir of its own)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crash"))

import pytest  # noqa: E402

import harness  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    harness.keep_logs_after_failures(outcome.get_result())
