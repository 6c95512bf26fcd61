"""Which runs of a check run at the same time.

Note [Runs side by side]
Most runs of a check are short, and most of a short run is the start of a Python
process that imports TensorFlow: one core's work, while the machine has more. So
runs whose inputs exist start side by side, as long as the ranks of the runs in
flight fit the cores (`--jobs`, default the cores this process may use; each rank
computes with one thread under the harness's determinism, tarantella/determinism.py):
on 2 cores the serial reference starts beside the calibration (tolerance mode), the
production serial run (exact mode) or a 1-device run, and the calibration of exact mode
beside the production run it reads. A run that compares itself with a reference
(TNT_REPRO_REFERENCE) starts once that reference has started: it reads the reference's
stored weights step by step, waiting for each (Note [Reading a reference while it runs]
in tarantella/_repro/weights.py); since the reference started first and holds its
cores, nothing waits for a run that cannot start. A run on more ranks than `--jobs`
runs alone. The results are identical to running one after the other: every run is
deterministic on its own (op determinism, fixed thread counts) and writes only to
its own directory. The check reads the results in the plan's order, as before, and
when it stops early (a failed or refused run) the runs still in flight are stopped.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Callable, Iterator, Sequence

from repro.runs import RunResult, RunSpec

__all__ = ["usable_cores", "in_plan_order"]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def in_plan_order(plan: Sequence[RunSpec], needs: dict[str, str | None], jobs: int,
                  execute: Callable[[RunSpec, threading.Event], RunResult],
                  on_start: Callable[[RunSpec], None] = lambda spec: None) -> Iterator[RunResult]:
    """Yield each run's result in the plan's order, running them side by side where `needs` (a run's name ->
    the name of the run it reads, which must have started first, or None) and `jobs` (cores) allow (Note [Runs
    side by side]). `execute(spec, stop)` runs one; when the caller stops iterating, the runs in flight get
    `stop` set and are waited for."""
    stop = threading.Event()
    waiting = list(plan)
    running: dict[concurrent.futures.Future, RunSpec] = {}
    started: set[str] = set()
    finished: dict[str, RunResult] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(plan))) as pool:
        try:
            for spec in plan:
                while spec.name not in finished:
                    busy = sum(min(s.devices, jobs) for s in running.values())
                    candidates = list(waiting)
                    while candidates:
                        candidate = candidates.pop(0)
                        need = needs.get(candidate.name)
                        if need is not None and need not in started:
                            continue
                        if running and busy + min(candidate.devices, jobs) > jobs:
                            continue
                        waiting.remove(candidate)
                        started.add(candidate.name)
                        on_start(candidate)
                        running[pool.submit(execute, candidate, stop)] = candidate
                        busy += min(candidate.devices, jobs)
                        candidates = list(waiting)   # a run that waited for this one to start may start now
                    assert running, f"{spec.name} waits for a run that is not in the plan: {needs}"
                    done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        finished[running.pop(future).name] = future.result()
                yield finished[spec.name]
        finally:
            stop.set()
