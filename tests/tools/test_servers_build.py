"""``servers/build`` builds once per machine however many processes ask at once.

The script runs for real against a temporary cache, with a stand-in ``go`` first on PATH: it
logs each call and makes the binaries asked for (instantly, not in minutes), so the script's
own logic (the lock, the checks, the move into place, the printed paths) is what is tested.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers import behind_a_held_lock

from servers import BUILD

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("flock") is None, reason="servers/build locks with flock"),
]

# Makes what each call would build: `go install ...@v` puts each named command into $GOBIN (the
# Collector Builder a script making the Collector at its manifest's output_path); `go build -o X`
# makes X. Every call is logged, and takes a moment so that builds would overlap.
FAKE_GO = r"""#!/usr/bin/env bash
set -eu
echo "$*" >>"$FAKE_GO_CALLS"
sleep 0.3
make() { mkdir -p "$(dirname "$1")"; printf '#!/bin/sh\n%s\n' "${2:-}" >"$1"; chmod +x "$1"; }
collector='out=$(sed -n "s/ *output_path: //p" "$2"); mkdir -p "$out"
touch "$out/otelcol-async-tee"; chmod +x "$out/otelcol-async-tee"'
case "$1" in
install)
    for arg; do
        case "$arg" in
        */builder@*) make "$GOBIN/builder" "$collector" ;;
        *@*) name="${arg%@*}"; make "$GOBIN/${name##*/}" ;;
        esac
    done ;;
build)
    while (($#)); do [[ "$1" == -o ]] && make "$2"; shift; done ;;
esac
"""


@pytest.fixture
def fake_go(tmp_path: Path) -> dict[str, str]:
    """The environment that runs servers/build with the stand-in go and a cache in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ASYNC_TEE_SERVERS_CACHE": str(tmp_path / "cache"),
        "FAKE_GO_CALLS": str(tmp_path / "go-calls.log"),
    }


def _held_lock(cache: Path) -> int:
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_three_at_once_build_once_and_all_print_the_built_paths(fake_go, tmp_path):
    cache = Path(fake_go["ASYNC_TEE_SERVERS_CACHE"])
    calls_log = Path(fake_go["FAKE_GO_CALLS"])
    runs = behind_a_held_lock([str(BUILD)], fake_go, cache / ".lock", tmp_path, calls_log)
    assert [run.returncode for run in runs] == [0, 0, 0], [run.stderr for run in runs]
    outputs = [run.stdout for run in runs]
    calls = Counter(Path(fake_go["FAKE_GO_CALLS"]).read_text().splitlines())
    assert calls
    assert max(calls.values()) == 1, calls  # each build step ran once, not thrice
    assert outputs[0] == outputs[1] == outputs[2]
    paths = dict(line.split("=", 1) for line in outputs[0].splitlines())
    assert {"otelcol", "prometheus", "promtool", "thanos"} <= paths.keys()
    for path in paths.values():
        assert Path(path).is_relative_to(cache), path
        assert os.access(path, os.X_OK), path
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [".lock"]


def test_check_takes_no_lock_and_says_whether_all_are_built(fake_go):
    cache = Path(fake_go["ASYNC_TEE_SERVERS_CACHE"])
    lock = _held_lock(cache)
    try:
        check = subprocess.run([str(BUILD), "--check"], env=fake_go, timeout=30, check=False)
        assert check.returncode == 1  # answered while a build holds the lock: nothing built
    finally:
        os.close(lock)
    subprocess.run([str(BUILD)], env=fake_go, check=True, capture_output=True, timeout=60)
    assert subprocess.run([str(BUILD), "--check"], env=fake_go, check=False).returncode == 0


def test_a_killed_builds_leftovers_are_cleared_by_the_next(fake_go):
    cache = Path(fake_go["ASYNC_TEE_SERVERS_CACHE"])
    leftover = cache / ".prometheus.abc123"
    (leftover / "out").mkdir(parents=True)
    subprocess.run([str(BUILD)], env=fake_go, check=True, capture_output=True, timeout=60)
    assert not leftover.exists()
