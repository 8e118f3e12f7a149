"""Cluster tests reuse the crash harness (a real `warren up` on a state dir of its own)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crash"))
