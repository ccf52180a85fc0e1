"""Without the trainers' packages their tests skip, but fail where CI requires the packages."""

from __future__ import annotations

import pytest
from trainers import required

MISSING = "async_tee_no_such_trainer"


def test_a_missing_package_skips_the_caller(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(required, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception):
        required.require(MISSING)


def test_a_missing_package_fails_where_required(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(required, "REQUIRED", True)
    with pytest.raises(ModuleNotFoundError):
        required.require(MISSING)


def test_verl_is_required_below_python_3_13_only(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(required, "REQUIRED", True)
    assert required.must_import("verl.utils.tracking", (3, 11))
    assert not required.must_import("verl.utils.tracking", (3, 13))
    assert required.must_import("lightning", (3, 13))
    monkeypatch.setattr(required, "REQUIRED", False)
    assert not required.must_import("lightning", (3, 11))
