"""One rank of a launched job, as the multi-rank tests start it (a real process).

Its rank comes from the launcher's variables its parent set, read the way async_tee reads
them. It tees the fixture's calls with values of its own (``reward = rank + 0.25`` plus
``--reward-offset``, which tells two runs apart, ``1000 x (rank + 1)`` prompt tokens a step,
a critic loss as PPO logs one, and a NaN ``grad_norm`` at step ``--nan-step``, 2 by
default), a step every ``--step-seconds``, until a line ``stop`` arrives on stdin (or,
with ``--steps``, that many steps are done). Then it flushes and prints one JSON line: its
rank, the steps it logged, what async_tee reports (``stats()``, the Prometheus address) and
the names of async_tee's threads. It keeps serving until stdin closes, then shuts down and
prints ``{"delivered": ...}``. ``--print-events`` puts the NaN's time on stderr. A thread
plays NeMo-RL's stall watchdog: every 0.2 s, at the last step, its held keys, its idle time
since the last step (``--watchdog committing``: 0, rollouts committing); with
``--watchdog-stops-after N`` it ends N ticks after the steps end.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import async_tee
from async_tee._declare.shipped import ROLLOUT_WATCHDOG

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_step.json"


def own_thread_names() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("async-tee"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="0: until stdin says stop")
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--nan-step", type=int, default=2, help="0: no NaN")
    parser.add_argument("--reward-offset", type=float, default=0.0, help="added to the reward")
    parser.add_argument("--print-events", action="store_true", help="the NaN's time on stderr")
    parser.add_argument(
        "--watchdog",
        choices=("growing", "committing"),
        default="growing",
        help="the idle it logs: since the last step, or 0 (rollouts committing)",
    )
    parser.add_argument(
        "--watchdog-stops-after",
        type=int,
        default=0,
        help="its thread ends this many ticks after the steps end (0: never)",
    )
    args = parser.parse_args()

    session = async_tee.start_telemetry()
    rank = session.settings.ranks.rank or 0
    calls = json.loads(FIXTURE.read_text())["calls"]
    setup = [call for call in calls if call["step"] == 0]
    step_calls = [call for call in calls if call["step"] != 0]
    stop = threading.Event()

    def wait_for_stop() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    progress = [0, time.monotonic()]  # the last completed step, and when
    ended = threading.Event()  # the session is about to end
    stepped = threading.Event()  # the steps are done

    def stall_watchdog() -> None:
        """NeMo-RL's watchdog: at the last completed step, its idle time and totals."""
        ticks_after_steps = 0
        while not ended.wait(0.2):  # on after the steps stop: a hang's shape
            if stepped.is_set():
                ticks_after_steps += 1
                if ticks_after_steps > args.watchdog_stops_after > 0:
                    return  # its thread died, or the loop it ran on hung
            step, at = progress
            if step:
                watchdog = {row.logger_key: float(rank + step) for row in ROLLOUT_WATCHDOG}
                growing = args.watchdog == "growing"
                watchdog["rollout/idle_s"] = time.monotonic() - at if growing else 0.0
                watchdog["gen_fleet/shards/healthy"] = 4.0
                watchdog["gen_fleet/shards/dead"] = float(rank)
                watchdog["gen_fleet/restart_attempts/0"] = 0.0  # per shard: not read
                async_tee.tee_rl_metrics_to_otel(watchdog, "", step)

    threading.Thread(target=stall_watchdog, name="stall-watchdog", daemon=True).start()
    for call in setup:
        async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"])
    # A fixed count of steps is never cut short; otherwise "stop" ends the pause and the loop.
    pause = threading.Event() if args.steps else stop
    steps = 0
    while (steps < args.steps) if args.steps else not stop.is_set():
        steps += 1
        for call in step_calls:
            metrics = dict(call["metrics"])
            if call["prefix"] == "train":
                metrics["reward"] = rank + 0.25 + args.reward_offset
                metrics["vllm/prompt_tokens"] = 1000 * (rank + 1)
                metrics["critic/loss"] = 0.5 + rank  # as PPO logs it, so every row has data
                metrics.update(buffer_size=8, avg_trajectory_age=1.5)  # as async GRPO does
                if steps == args.nan_step:
                    metrics["grad_norm"] = float("nan")  # a diverged value, counted once
                    if args.print_events:
                        print(json.dumps({"event": "nan", "at": time.time()}), file=sys.stderr)
            if call["prefix"] == "timing/train":  # validation every step, so every row has data
                async_tee.tee_rl_metrics_to_otel(
                    {"total_validation_time": 2.0}, "timing/validation", steps
                )
                validation = {"accuracy": 0.5, "avg_length": 90.0, "pass_k": 0.75}
                async_tee.tee_rl_metrics_to_otel(validation, "validation", steps)
                # a trainer's key of its own (§13), so rl.logged.value has data too
                mine = {"rewards/format/mean": 0.5 + rank}
                async_tee.tee_rl_metrics_to_otel(mine, "transformers", steps)
            finished = call.get("step_finished", False)
            async_tee.tee_rl_metrics_to_otel(metrics, call["prefix"], steps, finished)
        progress[:] = [steps, time.monotonic()]
        pause.wait(args.step_seconds)
    stepped.set()
    flushed = async_tee.flush(10)
    address = session.prometheus_address
    report = {
        "rank": rank,
        "steps": steps,
        "flushed": flushed,
        "exporting": session.is_exporting,
        "prometheus_address": list(address) if address else None,
        "stats": async_tee.stats(),
        "threads": own_thread_names(),
    }
    print(json.dumps(report), flush=True)
    stop.wait()  # keep serving /metrics until the test is done with it
    for _ in sys.stdin:  # and until it closes stdin
        pass
    ended.set()
    delivered = async_tee.shutdown_telemetry(10)
    print(json.dumps({"delivered": delivered, "at": time.time()}), flush=True)


if __name__ == "__main__":
    main()
