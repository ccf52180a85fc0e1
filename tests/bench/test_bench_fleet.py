"""The capacity harness on the real stacks: a small load, costed and counted.

``benchmarks/bench_fleet.py`` starts a stack (the remote-write one: one Collector, one
Prometheus 3; the fleet: 2 node agents into Thanos), drives a few simulated ranks into its
agents and counts, through the store's query API, every (rank, step) of the run.
"""

from __future__ import annotations

import _tiers as tiers
import bench_fleet
import pytest

RANKS, STEP_S, DURATION_S = 6, 0.5, 2.0


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.parametrize("target", ["remote-write", "fleet"])
def test_a_small_load_is_accepted_stored_and_costed_per_tier(tmp_path, target):
    out = str(tmp_path / "fleet.json")
    args = bench_fleet.parse_args(["--idle-s", "1", "--out", out, "--target", target])
    run = bench_fleet.run_load(args, RANKS, STEP_S, DURATION_S)
    steps = round(DURATION_S / STEP_S)
    points = run["generator"]["points_per_request"]

    assert run["generator"]["answers"] == {"2xx": RANKS * steps}
    agent = run["tiers"]["agent"]["figures"]
    assert agent["accepted"] == agent["sent"] == RANKS * steps * points
    assert agent["refused"] == agent["send_failed"] == 0
    assert run["store"] | {"caught_up_s": 0} == {
        "ranks_found": RANKS,
        "present": RANKS * steps,
        "missing": 0,
        "missing_first": [],
        "caught_up_s": 0,
        "samples_of_run": run["store"]["samples_of_run"],
        "query_error": "",
    }
    assert run["store"]["samples_of_run"] >= RANKS * steps * points
    assert run["past_knee"] == []
    for tier in ("agent", "store"):
        assert run["per_point"][tier]["cpu_us"] > 0
    table = bench_fleet.capacity({"0.5s": bench_fleet.knee([run])}, [run])
    cell = table["agent"]["10s"]
    assert cell["from"] == {"ranks": RANKS, "step_s": STEP_S}
    assert cell["ranks_per_core"] == pytest.approx(1e7 / (cell["cpu_us_per_point"] * points))


def test_a_step_missing_from_the_store_is_named():
    found = {0: {1, 2, 3}, 1: {1, 3}}
    assert tiers.missing_steps(found, ranks=3, steps=3) == [(1, 2), (2, 1), (2, 2), (2, 3)]
