"""``.ci/trainers-env`` builds the trainers' venv once per machine however many ask at once.

The script runs for real against a temporary cache, with a stand-in Python (``--python``): it
answers the version, makes a venv's folders, and logs each pip call (instantly, not the
minutes and gigabytes of torch), so the script's own logic (the lock, the check, the move into
place, the printed site-packages, ``.ci/use-trainers-env``'s .pth) is what is tested.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers import behind_a_held_lock

CI = Path(__file__).parents[2] / ".ci"
TRAINERS_ENV = CI / "trainers-env"
USE_TRAINERS_ENV = CI / "use-trainers-env"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("flock") is None, reason="trainers-env locks with flock"),
]

# A Python 3.99.0: `-c` prints its version (or, as a venv's python, its site-packages),
# `-m venv DIR` makes DIR with itself as DIR/bin/python and a pip script naming DIR, and every
# `-m pip ...` call is logged (after a moment, so that builds would overlap).
FAKE_PYTHON = r"""#!/usr/bin/env bash
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
case "$1" in
-c)
    case "$2" in
    *sysconfig*) echo "$here/lib/python3.99/site-packages" ;;
    *) echo 3.99.0 ;;
    esac ;;
-m)
    case "$2" in
    venv)
        mkdir -p "$3/bin" "$3/lib/python3.99/site-packages"
        cp "$0" "$3/bin/python"
        printf '#!%s/bin/python\n' "$3" >"$3/bin/pip"
        ln -s python "$3/bin/python3" ;;
    pip)
        echo "${*:3}" >>"$FAKE_PY_CALLS"
        sleep 0.3
        if [[ "$3" == freeze ]]; then echo torch==0; fi ;;
    esac ;;
esac
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> dict[str, str]:
    """The environment that runs trainers-env with a cache in tmp_path; the stand-in's path."""
    python = tmp_path / "python" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return {
        **os.environ,
        "ASYNC_TEE_TRAINERS_CACHE": str(tmp_path / "cache"),
        "FAKE_PY_CALLS": str(tmp_path / "pip-calls.log"),
        "FAKE_PYTHON": str(python),
    }


NAME = f"3.99.0-{hashlib.sha256((CI / 'trainers.txt').read_bytes()).hexdigest()[:12]}"


def _expected_site(env: dict[str, str]) -> Path:
    venv = Path(env["ASYNC_TEE_TRAINERS_CACHE"]) / NAME
    return venv / "lib" / "python3.99" / "site-packages"


def _held_lock(cache: Path, name: str = NAME) -> int:
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / f".{name}.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(TRAINERS_ENV), "--python", env["FAKE_PYTHON"], *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_three_at_once_build_once_and_all_print_the_site_packages(fake_python, tmp_path):
    cache = Path(fake_python["ASYNC_TEE_TRAINERS_CACHE"])
    command = [str(TRAINERS_ENV), "--python", fake_python["FAKE_PYTHON"]]
    calls_log = Path(fake_python["FAKE_PY_CALLS"])
    runs = behind_a_held_lock(command, fake_python, cache / f".{NAME}.lock", tmp_path, calls_log)
    assert [run.returncode for run in runs] == [0, 0, 0], [run.stderr for run in runs]
    outputs = [run.stdout for run in runs]
    calls = Counter(Path(fake_python["FAKE_PY_CALLS"]).read_text().splitlines())
    assert calls == {
        "install -q --upgrade pip": 1,
        "install -q -r trainers.txt": 1,
        "check": 1,
        "freeze": 1,
    }
    site = _expected_site(fake_python)
    assert outputs == [f"{site}\n"] * 3
    venv = site.parents[2]
    assert (venv / "trainers.txt").read_bytes() == (CI / "trainers.txt").read_bytes()
    assert (venv / "freeze.txt").read_text() == "torch==0\n"
    assert (venv / "bin" / "pip").read_text() == f"#!{venv}/bin/python\n"  # its final path
    assert (venv / "bin" / "python3").is_symlink()
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [f".{NAME}.lock"]


def test_check_takes_no_lock_and_prints_the_site_packages_once_built(fake_python):
    cache = Path(fake_python["ASYNC_TEE_TRAINERS_CACHE"])
    lock = _held_lock(cache)
    try:
        check = _run(fake_python, "--check")
        assert (check.returncode, check.stdout) == (1, "")  # answered while a build holds it
    finally:
        os.close(lock)
    assert _run(fake_python).returncode == 0
    check = _run(fake_python, "--check")
    assert (check.returncode, check.stdout) == (0, f"{_expected_site(fake_python)}\n")


def test_a_killed_builds_leftovers_are_cleared_by_the_next(fake_python):
    cache = Path(fake_python["ASYNC_TEE_TRAINERS_CACHE"])
    leftover = cache / f".{NAME}.build.abc123"
    (leftover / "venv" / "bin").mkdir(parents=True)
    assert _run(fake_python).returncode == 0
    assert not leftover.exists()


def test_another_pythons_build_goes_on_meanwhile(fake_python):
    cache = Path(fake_python["ASYNC_TEE_TRAINERS_CACHE"])
    other = _held_lock(cache, "3.98.0-000000000000")  # another Python's build, under way
    other_work = cache / ".3.98.0-000000000000.build.abc123"
    other_work.mkdir()
    try:
        assert _run(fake_python).returncode == 0
    finally:
        os.close(other)
    assert other_work.exists()  # not taken for a killed build's


def test_use_trainers_env_names_the_site_packages_in_a_pth_of_the_venvs(fake_python, tmp_path):
    venv = tmp_path / "fresh"
    subprocess.run([fake_python["FAKE_PYTHON"], "-m", "venv", str(venv)], check=True)
    out = subprocess.run(
        [str(USE_TRAINERS_ENV), str(venv)],
        env=fake_python,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pth = venv / "lib" / "python3.99" / "site-packages" / "async_tee_trainers.pth"
    assert out.stdout == f"{pth}\n"
    assert pth.read_text() == f"{_expected_site(fake_python)}\n"
