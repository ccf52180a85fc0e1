"""Owns ``python -m async_tee``: the same command line as ``async-tee``."""

from __future__ import annotations

import sys

from async_tee.cli import main

if __name__ == "__main__":
    sys.exit(main())
