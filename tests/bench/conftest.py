"""The benchmarks' own modules (``benchmarks/_loadgen.py``) are imported by name here."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
