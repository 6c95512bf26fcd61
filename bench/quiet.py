"""Whether a measured run had its machine to itself (issue 41 §3).

Note [A quiet machine]
A measured step time is the system's only if nothing else computed on the run's cores while it ran. On a
fresh clone the main job once printed a measured speedup of 1.90x at 2 ranks on 2 cores: another process
had shared the cores during the 1-device run (load average 3.06), which made the baseline slow. Either of
two signs marks a run as not quiet:
- load: the 1-minute load average at the run's end (taken by bench/programs/train_benchmark.py on rank 0's
  machine) exceeds the threads the run itself keeps busy there (ranks on that node x threads per rank) by
  more than LOAD_EXCESS. 0.75 is most of one other busy process over the last minute; quiet runs here end
  with a load between 1 below and 0.6 above their own threads (the average lags behind a run's start, and
  the launcher and the engine's threads add a little; results/*/runs.csv);
- spread: the timed steps' coefficient of variation exceeds SPREAD, and their standard deviation
  SPREAD_FLOOR_S. 10 %: quiet runs here spread 1-6 % (results/*/runs.csv), and a process that comes and
  goes during a run shows there even when the load average at the end has forgotten it. The floor: steps
  of a few milliseconds (the tests' tiny models) spread by 10-20 % on a quiet machine, since one time slice
  of the scheduler (a few ms) lands on one step or another; 20 ms is a slice on a busy 2-core Linux.
A speedup is only as good as both of its runs, so a speedup against a 1-device run that was not quiet is
flagged too: records.derive_figures names its baseline, bench/sweep/scaling.py marks that label with the
reason (unquiet_baseline), and the table and the plot read the mark back (baseline_not_quiet).
"""
from __future__ import annotations

import math
import statistics

__all__ = ["LOAD_EXCESS", "SPREAD", "SPREAD_FLOOR_S", "not_quiet_because", "unquiet_baseline", "baseline_not_quiet"]

LOAD_EXCESS = 0.75
SPREAD = 0.10
SPREAD_FLOOR_S = 0.020
_BASELINE_MARK = " (not quiet: "


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def not_quiet_because(row: dict) -> str:
    """'' when the measured run in `row` (a runs.csv row) shows no sign of sharing its machine, else the signs,
    in a few words (Note [A quiet machine]). A row without a load average is judged by its spread alone."""
    reasons = []
    load = _number(row.get("load_average_1m"))
    threads = _number(row.get("threads_per_rank")) or 1.0
    own = (_number(row.get("devices_per_node")) or _number(row.get("devices")) or 1.0) * threads
    if load is not None and load - own > LOAD_EXCESS:
        reasons.append(f"load {load:.2f} with {own:g} threads of its own")
    times = row.get("step_times_s")
    if isinstance(times, list) and len(times) >= 2:
        deviation = statistics.pstdev(times)
        spread = deviation / statistics.fmean(times)
        if spread > SPREAD and deviation > SPREAD_FLOOR_S:
            reasons.append(f"step times spread {spread:.0%}")
    return ", ".join(reasons)


def unquiet_baseline(label: str, because: str) -> str:
    """A speedup_baseline label marked: its 1-device run was not quiet, for `because`."""
    return f"{label}{_BASELINE_MARK}{because})"


def baseline_not_quiet(label) -> bool:
    """Whether a speedup_baseline label (as written, or read back from runs.csv) carries that mark."""
    return isinstance(label, str) and _BASELINE_MARK in label
