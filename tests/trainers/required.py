"""Whether the trainers' heavy test packages must be there: skip without them, or fail in CI.

They come from .ci/trainers.txt (.ci/trainers-env builds them once per machine). CI sets
ASYNC_TEE_REQUIRE_TRAINERS=1, where a missing one fails the tests instead of skipping them.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import pytest

REQUIRED = os.environ.get("ASYNC_TEE_REQUIRE_TRAINERS") == "1"


def must_import(name: str, python: tuple[int, ...] = sys.version_info[:2]) -> bool:
    """Whether ``name`` must import here: where REQUIRED, and for verl below Python 3.13 only
    (it does not install on 3.13)."""
    return REQUIRED and not (name.split(".")[0] == "verl" and python >= (3, 13))


def require(name: str) -> ModuleType:
    """Import ``name``; without it, skip the caller (its module, at module level) or fail."""
    if must_import(name):
        return importlib.import_module(name)
    return pytest.importorskip(name)
