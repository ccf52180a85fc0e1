"""Large dicts: the tee's key filter against a whole copy, in caller latency and queue memory.

Usage: ``python benchmarks/bench_sizes.py [--values {float,list}] [--calls N] [--blocks N]
[--quick] [--out PATH]`` (``run_all.py`` runs it as the ``sizes`` part of
``results/latest.json``; run alone, it writes its JSON and markdown to a temp dir unless
``--out`` is given).

The dicts: the fixture's 68-key ``train`` dict (``tests/fixtures/grpo_step.json``) padded
with keys nothing reads, ``env/noise_{i}``, to 68, 2,000 and 100,000 keys. The padding
values are floats, ``float(i)``, by default; ``--values list`` makes each a list of 8 new
floats, as a rollout env logging per-environment values would. A queued snapshot only
references the values, so they change neither variant's memory; a copy touches every value
(its reference count), so list values make the whole copy somewhat slower at 100,000 keys,
and a dict holding lists is tracked by the garbage collector. Floats are the default: the
figures then understate, if anything, what filtering saves.

The variants, the same call ``tee_rl_metrics_to_otel(d, "train", step)``:

- ``filtered``: the shipped behaviour: a ``train`` dict, whatever its size, is snapshotted
  to the keys the worker reads from it (``async_tee._caller._SNAPSHOT_KEYS["train"]``, a
  tuple, set by the session), so a queued dict keeps no unread value alive;
- ``whole``: the behaviour before, every dict copied with ``dict(metrics)``:
  ``_SNAPSHOT_KEYS["train"]`` is set to None (copied whole) and ``_handoff.caller._WHOLE_UP_TO``
  to ``10**12`` (no key left out) for that block, inside its session, and both are
  restored after it.

There is no size threshold any more: the shipped rule filters every size. At small sizes
the whole copy is cheaper (``dict(d)`` of 68 keys is one C-level copy; the filter looks up
each read key); by how much, and how much the filter saves at 2,000 and 100,000 keys, is
what this bench reports.

**Caller latency.** Telemetry runs with ``OTEL_METRICS_EXPORTER=none`` (no exporter), the
default queue and drain interval, one fresh session per block (``shutdown_telemetry(1)``
and ``testing.reset`` after each). One call is bracketed by two ``perf_counter_ns()``
reads in the loop ``bench_latency.py`` uses (``_blocks.py``), back to back, a new step
each call; every sample is kept, and p50, p99, p99.9 and max are reported from all of
them (pooled over blocks), with the median of the per-block p50s, which the ratios use.
An empty timer row (the two reads around ``pass``) gives the floor every figure includes.
``--calls`` (100,000 by default) per row, split over the blocks; a whole copy of 100,000
keys takes ~2 ms, so those rows get 4 % of the calls. Back to back, the caller outruns
the worker (which drains every 50 ms, or when the queue reaches three quarters), so the
queue overflows in most rows and ``put`` drops the oldest snapshot, freeing it on the
caller's thread: part of what a copy costs there. The ``dropped`` column counts it.

**Copy against filter, per size.** For each size, the whole copy's p50 against the
filter's (median of block p50s): their ratio, their difference in µs (the timer cancels
out) and which is cheaper. Reported, not asserted.

Every latency row (both variants of every size, and the empty timer) runs interleaved:
each of ``--blocks`` rounds runs every row once, in a rotated order.

**Queue memory.** Each (size, variant) cell runs in its own child process, so no earlier
cell's freed memory is reused: ``start_telemetry(environ={"OTEL_METRICS_EXPORTER":
"none"}, drain_interval_s=60.0, queue_size=1024)``, the variant's snapshot rule set in the
session (as above), the queue's high-water mark raised above its capacity (so the fill
does not wake the worker: it sleeps throughout, which ``recorded`` confirms), a warm-up (8
tees, a flush, ``gc.collect()``), then 1,024 tees of the same dict, step 1..1,024. Held:
the growth of ``VmRSS`` (``/proc/self/status``) over the fill, in a first session; then,
in a second session after ``shutdown_telemetry(1)``, the growth of ``tracemalloc``'s
traced memory over the same fill (tracemalloc started after the warm-up). A whole copy of
100,000 keys is ~3.7 MiB, so that cell fills 64 slots (any cell whose 1,024 copies would
exceed ``MEMORY_BUDGET``) and its figures for a full queue are extrapolated linearly
(x 16), labelled so. ``sys.getsizeof`` of one queued item (snapshot dict, the two tuples)
is reported beside them.

Full: 9 blocks, about 20 s on a 2-core VM. ``--quick``: 4,000 calls a row in 2 blocks
(a smoke run, no figure to rely on), about 3 s.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from time import monotonic_ns
from typing import Any

from _blocks import (
    TIMER,
    WARMUP_CALLS,
    Block,
    Condition,
    Env,
    Plan,
    Target,
    run_cells,
    summarise,
)
from _common import (
    bench_parser,
    fmt,
    load_train_dict,
    machine_info,
    md_table,
    parse_bench_args,
    progress,
    publish,
    quiet_logging,
    rss_bytes,
    text_table,
)

import async_tee
from async_tee import testing
from async_tee._handoff import caller as _caller

SIZES = (68, 2_000, 100_000)
VARIANTS = ("filtered", "whole")
PREFIX = "train"
UNBOUNDED = 10**12  # _WHOLE_UP_TO for the whole-copy variant: no key left out
NO_EXPORTER = {"OTEL_METRICS_EXPORTER": "none"}
STOP_S = 1.0  # shutdown_telemetry's budget between blocks and phases
# Share of --calls for a size's rows: a whole copy of 100,000 keys takes ~2 ms.
CALLS_SHARE = {100_000: 0.04}
PAD_VALUES = ("float", "list")

QUEUE_SIZE = 1024
MEMORY_BUDGET = 1024**3  # a cell whose full queue of copies would hold more fills less
CAPPED_FILL = 64
MEMORY_WARMUP = 8
MIB = 1024 * 1024

# ------------------------------------------------------------------ dicts


def padded_dict(size: int, values: str) -> dict[str, Any]:
    """The fixture's 68-key train dict padded to ``size`` keys that nothing reads."""
    d = load_train_dict()
    for i in range(size - len(d)):
        d[f"env/noise_{i}"] = float(i) if values == "float" else [float(i + j) for j in range(8)]
    return d


@contextlib.contextmanager
def snapshot_rule(variant: str) -> Iterator[tuple[str, ...]]:
    """The running session's tee snapshotting ``train`` dicts as ``variant`` does.

    ``filtered``: the session's own rule, checked to be a key tuple; ``whole``:
    ``_SNAPSHOT_KEYS["train"]`` None and ``_WHOLE_UP_TO`` unbounded, both restored after.
    Yields the session's (shipped) ``train`` keys. Only inside a session: starting one
    re-attaches the caller, replacing both knobs.
    """
    keys = _caller._SNAPSHOT_KEYS
    shipped, whole_up_to = keys.get(PREFIX), _caller._WHOLE_UP_TO
    if _caller.attached() is None or not isinstance(shipped, tuple):
        raise RuntimeError(f"no session snapshotting {PREFIX!r} dicts to keys: {shipped!r}")
    if variant == "whole":
        keys[PREFIX] = None
        _caller._WHOLE_UP_TO = UNBOUNDED
    try:
        yield shipped[0]
    finally:
        keys[PREFIX] = shipped
        _caller._WHOLE_UP_TO = whole_up_to


def stop_session(handle: async_tee.Pipeline | async_tee.DisabledSession) -> bool:
    """Shut telemetry down (``STOP_S``), join its threads, and reset the declarations."""
    threads = handle.threads
    ok = async_tee.shutdown_telemetry(STOP_S)
    for thread in threads:
        thread.join(3 * STOP_S)
    testing.reset(STOP_S)
    return ok


# ------------------------------------------------------------------ caller latency


def session_setup(variant: str) -> Callable[[Env], contextlib.AbstractContextManager[Target]]:
    """A block's setup: a fresh session without exporter, the tee snapshotting as ``variant``."""

    @contextlib.contextmanager
    def setup(env: Env) -> Iterator[Target]:
        handle = async_tee.start_telemetry(environ=NO_EXPORTER)
        if not handle.is_exporting:
            raise RuntimeError("start_telemetry did not start")
        info: dict[str, Any] = {}
        try:
            with snapshot_rule(variant):
                yield Target(
                    async_tee.tee_rl_metrics_to_otel,
                    pipeline=True,
                    settle=lambda: async_tee.flush(2 * STOP_S),
                    threads=handle.threads,
                    info=info,
                )
        finally:
            started = time.perf_counter()
            info["shutdown_ok"] = stop_session(handle)
            info["shutdown_s"] = time.perf_counter() - started

    return setup


Cell = tuple[Condition, Env]
LABELS = {"filtered": "filtered", "whole": "whole copy"}


def latency_cells(values: str) -> tuple[list[Cell], dict[int, dict[str, Any]]]:
    """Every latency row with its dict: both variants per size, and the timer."""
    dicts = {size: padded_dict(size, values) for size in SIZES}
    cells: list[Cell] = []
    for size in SIZES:
        share = CALLS_SHARE.get(size, 1.0)
        env = Env(dicts[size], {})
        cells += [
            (
                Condition(
                    f"{size}_{variant}",
                    f"{size} keys, {LABELS[variant]}",
                    session_setup(variant),
                    calls_share=share,
                ),
                env,
            )
            for variant in VARIANTS
        ]
    cells.append((TIMER, Env({}, {})))
    return cells, dicts


def row_summary(condition: Condition, blocks: Sequence[Block]) -> dict[str, Any]:
    """``summarise`` without the plot curve (this part is not plotted)."""
    row = summarise(condition, blocks)
    row.pop("curve", None)
    return row


def ratio(slow: dict[str, Any], fast: dict[str, Any]) -> dict[str, float]:
    """``slow`` over ``fast``: p50 (median of block p50s), pooled p99, p99.9 and max."""
    out = {"p50": slow["median_block_p50_us"] / fast["median_block_p50_us"]}
    out.update({name: slow["us"][name] / fast["us"][name] for name in ("p99", "p99.9", "max")})
    return out


def comparison(keys: int, whole: dict[str, Any], filtered: dict[str, Any]) -> dict[str, Any]:
    """Copy against filter at one size, by p50 (median of block p50s): reported, not asserted."""
    copy_p50, filter_p50 = whole["median_block_p50_us"], filtered["median_block_p50_us"]
    return {
        "keys": keys,
        "copy_p50_us": copy_p50,
        "filter_p50_us": filter_p50,
        "copy_over_filter_p50": copy_p50 / filter_p50,
        "copy_minus_filter_p50_us": copy_p50 - filter_p50,
        "cheaper": "filter" if filter_p50 < copy_p50 else "copy",
    }


def latency_report(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rows per size and variant, whole/filtered ratios, the per-size comparison, the timer."""
    sizes: dict[str, Any] = {}
    for size in SIZES:
        filtered, whole = results[f"{size}_filtered"], results[f"{size}_whole"]
        sizes[str(size)] = {
            "filtered": filtered,
            "whole": whole,
            "whole_over_filtered": ratio(whole, filtered),
        }
    return {
        "sizes": sizes,
        "timer": results["timer"],
        "comparison": [
            comparison(size, sizes[str(size)]["whole"], sizes[str(size)]["filtered"])
            for size in SIZES
        ],
    }


# ------------------------------------------------------------------ queue memory


def item_bytes(d: dict[str, Any]) -> int:
    """``sys.getsizeof`` of one queued item as the tee builds it now (values not counted)."""
    keys, whole_up_to = _caller._SNAPSHOT_KEYS[PREFIX], _caller._WHOLE_UP_TO
    snapshot: Any
    if keys is not None:
        snapshot = (keys[0], tuple(map(d.get, keys[0], keys[2])))
    elif len(d) <= whole_up_to:
        snapshot = dict(d)
    else:
        snapshot = dict(islice(d.items(), whole_up_to))
        snapshot[_caller.LEFT_OUT] = len(d) - whole_up_to
    teed = (snapshot, PREFIX, 10**6, False, monotonic_ns())
    item = (teed, 10**6)
    ints = sys.getsizeof(teed[2]) + sys.getsizeof(teed[4]) + sys.getsizeof(item[1])
    own = sys.getsizeof(snapshot[1]) if isinstance(snapshot, tuple) else 0  # the values tuple
    return sys.getsizeof(snapshot) + own + sys.getsizeof(teed) + sys.getsizeof(item) + ints


@contextlib.contextmanager
def asleep_session(variant: str) -> Iterator[tuple[Any, tuple[str, ...], int]]:
    """A session whose worker sleeps through a fill of the whole queue, the tee snapshotting
    as ``variant``; yields the queue, the shipped ``train`` keys and ``_WHOLE_UP_TO``."""
    handle = async_tee.start_telemetry(
        environ=NO_EXPORTER, drain_interval_s=60.0, queue_size=QUEUE_SIZE
    )
    queue = _caller.attached()
    if not handle.is_exporting or queue is None:
        raise RuntimeError("start_telemetry did not start")
    queue.high_water = queue.capacity + 1  # a full queue must not wake the worker
    whole_up_to = _caller._WHOLE_UP_TO
    try:
        with snapshot_rule(variant) as shipped:
            yield queue, shipped, whole_up_to
    finally:
        stop_session(handle)


def fill(d: dict[str, Any], n: int, queue: Any, measure: Callable[[], int]) -> dict[str, Any]:
    """Warm up, then ``n`` tees of ``d`` on a sleeping worker; ``measure()`` before and after."""
    tee = async_tee.tee_rl_metrics_to_otel
    for step in range(MEMORY_WARMUP):
        tee(d, PREFIX, -1 - step)
    async_tee.flush(2 * STOP_S)
    gc.collect()
    recorded = async_tee.stats()["recorded"]
    before = measure()
    for step in range(1, n + 1):
        tee(d, PREFIX, step)
    after = measure()
    return {
        "bytes": after - before,
        "queue_len": len(queue),
        "recorded_during_fill": async_tee.stats()["recorded"] - recorded,
    }


def traced_bytes() -> int:
    return tracemalloc.get_traced_memory()[0]


def memory_cell(size: int, variant: str, filled: int, values: str) -> dict[str, Any]:
    """One cell, in this (child) process: RSS growth over a fill, then traced growth."""
    d = padded_dict(size, values)
    with asleep_session(variant) as (queue, shipped, whole_up_to):
        rss = fill(d, filled, queue, rss_bytes)
        item = item_bytes(d)
    with asleep_session(variant) as (queue, _, _):
        tracemalloc.start()
        try:
            traced = fill(d, filled, queue, traced_bytes)
        finally:
            tracemalloc.stop()
    return {
        "keys": size,
        "variant": variant,
        "filled": filled,
        "rss": rss,
        "traced": traced,
        "item_bytes_getsizeof": item,
        "snapshot_keys": len(shipped),
        "snapshot_keys_in_dict": sum(key in d for key in shipped),
        "whole_up_to_shipped": whole_up_to,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def memory_fill(d: dict[str, Any]) -> int:
    """Slots a whole-copy cell fills: the queue, or ``CAPPED_FILL`` above ``MEMORY_BUDGET``."""
    return QUEUE_SIZE if QUEUE_SIZE * sys.getsizeof(dict(d)) <= MEMORY_BUDGET else CAPPED_FILL


def run_memory_cell(size: int, variant: str, filled: int, values: str) -> dict[str, Any]:
    """``memory_cell`` in a child process of its own; its JSON line, summarised."""
    command = [sys.executable, __file__, "--memory-cell", f"{size}:{variant}:{filled}"]
    command += ["--values", values]
    started = time.perf_counter()
    done = subprocess.run(command, check=False, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"memory cell {size} {variant} failed: exit {done.returncode}")
    cell: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    scale = QUEUE_SIZE / filled
    cell.update(
        extrapolated=filled < QUEUE_SIZE,
        scale_to_queue=scale,
        traced_queue_mib=cell["traced"]["bytes"] * scale / MIB,
        rss_queue_mib=cell["rss"]["bytes"] * scale / MIB,
        traced_per_item_bytes=cell["traced"]["bytes"] / filled,
        rss_per_item_bytes=cell["rss"]["bytes"] / filled,
        worker_slept=all(
            cell[m]["recorded_during_fill"] == 0 and cell[m]["queue_len"] == filled
            for m in ("rss", "traced")
        ),
        child_s=time.perf_counter() - started,
    )
    progress(
        f"memory {size:>7} keys {variant:<8} filled {filled:>4}: traced "
        f"{cell['traced']['bytes'] / MIB:9.2f} MiB, RSS {cell['rss']['bytes'] / MIB:9.2f} MiB"
        f" ({cell['child_s']:.1f} s)"
    )
    return cell


def memory_report(dicts: dict[int, dict[str, Any]], values: str) -> dict[str, Any]:
    """Both variants per size: what a full queue holds, each cell in its own process."""
    sizes: dict[str, Any] = {}
    for size in SIZES:
        filtered = run_memory_cell(size, "filtered", QUEUE_SIZE, values)
        whole = run_memory_cell(size, "whole", memory_fill(dicts[size]), values)
        sizes[str(size)] = {
            "filtered": filtered,
            "whole": whole,
            "whole_over_filtered_traced": whole["traced_queue_mib"] / filtered["traced_queue_mib"],
            "whole_over_filtered_rss": (
                whole["rss_queue_mib"] / filtered["rss_queue_mib"]
                if filtered["rss_queue_mib"] > 0
                else None
            ),
        }
    return {
        "queue_size": QUEUE_SIZE,
        "memory_budget_mib": MEMORY_BUDGET / MIB,
        "capped_fill": CAPPED_FILL,
        "sizes": sizes,
    }


# ------------------------------------------------------------------ output

TITLE = "Large dicts: the tee's key filter against a whole copy"
LATENCY_HEADER = (
    "keys",
    "n f/w",
    "filtered p50",
    "p99",
    "p99.9",
    "max",
    "whole p50",
    "p99",
    "p99.9",
    "max",
    "whole/filtered p50",
    "p99",
    "dropped f/w",
)
COMPARISON_HEADER = (
    "keys",
    "copy p50",
    "filter p50",
    "copy - filter p50",
    "copy/filter p50",
    "cheaper",
)
MEMORY_HEADER = (
    "keys",
    "filled f/w",
    "filtered traced MiB",
    "whole traced MiB",
    "x traced",
    "filtered RSS MiB",
    "whole RSS MiB",
    "bytes/item f (traced, getsizeof)",
    "bytes/item w (traced, getsizeof)",
    "worker slept",
)


def _dropped(row: dict[str, Any]) -> str:
    return str(row["pipeline"].get("overflow", ""))


def latency_rows(latency: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per size: pooled percentiles of both variants, and their ratios."""
    rows: list[tuple[str, ...]] = []
    for size, entry in latency["sizes"].items():
        f, w, x = entry["filtered"], entry["whole"], entry["whole_over_filtered"]
        rows.append(
            (
                f"{int(size):,}",
                f"{f['n']}/{w['n']}",
                *(fmt(f["us"][p]) for p in ("p50", "p99", "p99.9", "max")),
                *(fmt(w["us"][p]) for p in ("p50", "p99", "p99.9", "max")),
                f"{x['p50']:.2f}",
                f"{x['p99']:.2f}",
                f"{_dropped(f)}/{_dropped(w)}",
            )
        )
    return rows


def comparison_rows(latency: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per size: copy against filter by p50 (median of block p50s)."""
    return [
        (
            f"{v['keys']:,}",
            fmt(v["copy_p50_us"]),
            fmt(v["filter_p50_us"]),
            ("+" if v["copy_minus_filter_p50_us"] >= 0 else "")
            + fmt(v["copy_minus_filter_p50_us"]),
            f"{v['copy_over_filter_p50']:.2f}",
            v["cheaper"],
        )
        for v in latency["comparison"]
    ]


def timer_line(latency: dict[str, Any]) -> str:
    """The empty timer pair's figures: the floor every latency figure includes."""
    timer = latency["timer"]
    figures = ", ".join(f"{p} {fmt(timer['us'][p])}" for p in ("p50", "p99", "p99.9", "max"))
    return (
        f"Empty timer pair (the floor every figure includes), µs: {figures} "
        f"(median of block p50s {timer['median_block_p50_us']:.3f}, n {timer['n']})."
    )


def _mib(cell: dict[str, Any], key: str) -> str:
    return f"{cell[key]:.2f}" + ("*" if cell["extrapolated"] else "")


def memory_rows(memory: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per size: a full queue's held memory, both variants."""
    rows: list[tuple[str, ...]] = []
    for size, entry in memory["sizes"].items():
        f, w = entry["filtered"], entry["whole"]
        rows.append(
            (
                f"{int(size):,}",
                f"{f['filled']}/{w['filled']}",
                _mib(f, "traced_queue_mib"),
                _mib(w, "traced_queue_mib"),
                f"{entry['whole_over_filtered_traced']:.1f}",
                _mib(f, "rss_queue_mib"),
                _mib(w, "rss_queue_mib"),
                f"{f['traced_per_item_bytes']:.0f}, {f['item_bytes_getsizeof']}",
                f"{w['traced_per_item_bytes']:.0f}, {w['item_bytes_getsizeof']}",
                "yes" if f["worker_slept"] and w["worker_slept"] else "**no**",
            )
        )
    return rows


def section(report: dict[str, Any]) -> list[str]:
    """The three tables as markdown lines (no title)."""
    config, latency, memory = report["config"], report["latency"], report["memory"]
    capped = [f"{int(s):,}" for s, e in memory["sizes"].items() if e["whole"]["extrapolated"]]
    return [
        f"The fixture's 68-key `train` dict padded with unread `env/noise_i` keys "
        f"({config['values']} values). `filtered`: shipped, every `train` dict snapshotted "
        f"to the {config['train_snapshot_keys']} keys the worker reads from it "
        f"({config['train_snapshot_keys_in_dict']} of them in the fixture's dict), whatever "
        "its size; `whole`: `_SNAPSHOT_KEYS['train']` set to None and `_WHOLE_UP_TO` to "
        "10**12 (every dict copied whole, as before). Telemetry on, no exporter, default "
        f"queue, back to back, {config['blocks']} interleaved blocks per row; times in µs "
        "from all samples, timer included; ratios use the median of block p50s (p50) and "
        "pooled p99. `dropped`: dicts the full queue dropped (back to back overflows it).",
        "",
        *md_table(LATENCY_HEADER, latency_rows(latency)),
        "",
        timer_line(latency),
        "",
        "Copy against filter per size (p50: median of block p50s; µs). Reported, not "
        "asserted: the filter is shipped at every size, so a queued dict keeps no unread "
        "value alive, even where the copy is cheaper.",
        "",
        *md_table(COMPARISON_HEADER, comparison_rows(latency)),
        "",
        f"Queue memory: a {memory['queue_size']}-slot queue filled with tees of the same "
        "dict (new step each) while the worker sleeps; growth of tracemalloc's traced "
        "memory and of RSS over the fill, each cell in its own process. "
        + (
            f"\\* {', '.join(capped)} keys whole: {memory['capped_fill']} slots filled, "
            f"extrapolated linearly to {memory['queue_size']}."
            if capped
            else ""
        ),
        "",
        *md_table(MEMORY_HEADER, memory_rows(memory)),
    ]


def console(report: dict[str, Any]) -> list[str]:
    latency, memory = report["latency"], report["memory"]
    return [
        "Caller latency per tee call, µs (pooled; ratios: p50 median of blocks, pooled p99)",
        *text_table(LATENCY_HEADER, latency_rows(latency)),
        timer_line(latency),
        "",
        "Copy against filter per size (p50: median of block p50s; reported, not asserted)",
        *text_table(COMPARISON_HEADER, comparison_rows(latency)),
        "",
        "Queue memory, full queue (* extrapolated from a partial fill)",
        *text_table(MEMORY_HEADER, memory_rows(memory)),
    ]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--values", choices=PAD_VALUES, default="float", help="padding values")
    parser.add_argument("--calls", type=int, default=None, help="calls per row (x its share)")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--memory-cell", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return args if args.memory_cell else parse_bench_args(parser, "sizes", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logging()
    # Back to back overflows the queue in most rows, by design: the drops are counted in
    # the tables, so the warnings about them stay off stderr.
    logging.getLogger("async_tee").setLevel(logging.ERROR)
    if args.memory_cell:  # a child of memory_report
        size, variant, filled = args.memory_cell.split(":")
        print(json.dumps(memory_cell(int(size), variant, int(filled), args.values)))
        return 0
    calls = args.calls or (4_000 if args.quick else 100_000)
    blocks = args.blocks or (2 if args.quick else 9)
    plan = Plan(blocks, calls, calls, 0.0)
    started = time.perf_counter()
    cells, dicts = latency_cells(args.values)
    results = {
        c.key: row_summary(c, b)
        for (c, _), b in zip(cells, run_cells(cells, plan).values(), strict=True)
    }
    latency = latency_report(results)
    memory = memory_report(dicts, args.values)
    shipped = memory["sizes"][str(SIZES[0])]["filtered"]
    report = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "values": args.values,
            "blocks": blocks,
            "calls_per_row": calls,
            "calls_share": {str(k): v for k, v in CALLS_SHARE.items()},
            "warmup_calls_max": WARMUP_CALLS,
            "train_snapshot_keys": shipped["snapshot_keys"],
            "train_snapshot_keys_in_dict": shipped["snapshot_keys_in_dict"],
            "whole_up_to_shipped": shipped["whole_up_to_shipped"],
            "whole_up_to_whole_variant": UNBOUNDED,
            "sizes": SIZES,
        },
        "latency": latency,
        "memory": memory,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "duration_s": time.perf_counter() - started,
    }
    publish(args.out, report, TITLE, section(report), console(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
