"""tnt-bench scaling --kill-rank-at K: the sweep's largest measured count once more under `tarantella --elastic`,
its last rank killed (SIGKILL) after step K (counting warm-up). Its row says how long the job took to go on, how
many steps it trained again, and its step time before (the same count's run without --elastic) and after (the
survivors, committing every step). The program's side is bench/programs/rank_fault.py."""
from __future__ import annotations

import json
import os
import statistics

from bench.errors import BenchUsageError
from bench.sweep.options import SweepOptions
from bench.sweep.runner import SweepRunError, run_point

__all__ = ["check_rank_loss", "rank_loss_count", "run_rank_loss"]


def check_rank_loss(options: SweepOptions) -> None:
    """User errors before any run."""
    step = options.kill_rank_at
    if step is None:
        return
    if options.simulate or options.framework != "tnt":
        raise BenchUsageError("--kill-rank-at measures an elastic tnt job: not with --simulate or --framework keras")
    total = options.warmup_steps + options.steps
    if not 1 <= step <= total - 3:
        raise BenchUsageError(f"--kill-rank-at {step}: the run has {total} steps (warm-up included) and the "
                              f"survivors need 3 after the kill (one traced, two timed); choose 1..{total - 3} "
                              f"or raise --steps")


def rank_loss_count(measured: list[int]) -> int:
    """The largest measured count that can lose a rank."""
    counts = [count for count in measured if count >= 2]
    if not counts:
        raise BenchUsageError("--kill-rank-at needs a measured count of at least 2 devices (--devices)")
    return max(counts)


def run_rank_loss(options: SweepOptions, devices: int, micro_batch: int, before: dict, on_step=None) -> dict:
    """The row of the run with a rank killed; `before` is the same count's measured row."""
    record_path = os.path.join(os.path.abspath(options.out), ".rank_loss_fault.json")
    if os.path.exists(record_path):
        os.remove(record_path)
    result = run_point(options, devices, micro_batch, on_step=on_step, fault=(options.kill_rank_at, record_path))
    resumed = result.get("elastic")
    if resumed is None or not os.path.exists(record_path):
        raise SweepRunError(f"the run on {devices} device(s) with --kill-rank-at {options.kill_rank_at} lost no "
                            f"rank (command: {result['command']})")
    with open(record_path, encoding="utf-8") as handle:
        fault = json.load(handle)
    os.remove(record_path)
    return {"devices": devices, "devices_after": resumed["ranks"], "killed_rank": fault["rank"],
            "killed_after_step": fault["step"], "recovery_s": resumed["first_step_end_time"] - fault["time"],
            "steps_redone": fault["step"] - resumed["resumed_from_step"], "generation": resumed["generation"],
            "step_time_before_s": before["step_time_median_s"],
            "step_time_after_s": statistics.median(result["step_times_s"]),
            "load_average_1m": result.get("load_average_1m"), "elapsed_s": result["elapsed_s"],
            "command": result["command"]}
