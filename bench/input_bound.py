"""Whether a measured run with real input (`--data jpeg`) was bound by its input pipeline or by its model.

Note [Input-bound]
Before training, every rank times its own input pipeline alone for 20 micro-batches, all ranks at the same
moment, so that they share the node's cores as they do in training (bench/programs/train_benchmark.py); the
slowest rank's seconds per micro-batch are the run's `input_alone_s`. Its share of the training step is

    input_share = input_alone_s / median step time

On CPUs the pipeline and the model share the cores, and a step costs about input + model; on a GPU node the
host's cores feed the device, and a step costs about max(input, model). Either way, where the pipeline alone
takes at least half of the step (INPUT_BOUND_SHARE), the input is the larger part of a step on shared cores, or
stands within a factor 2 of stalling the device: the run is called input-bound, and a faster model would not
make its steps much faster. Below that it is compute-bound. The share is recorded beside the verdict
(runs.csv `input_share`), so a reader can draw the line elsewhere.
"""
from __future__ import annotations

import time

__all__ = ["INPUT_BOUND_SHARE", "seconds_per_batch", "input_fields"]

INPUT_BOUND_SHARE = 0.5


def seconds_per_batch(dataset, batches: int = 20) -> float:
    """Seconds per batch of `dataset` read alone (nothing trains meanwhile). Its first batch, the pipeline's
    start (files opened, buffers filled), is not timed."""
    iterator = iter(dataset)
    next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - started) / batches


def input_fields(input_alone_s: float | None, step_s: float) -> dict:
    """runs.csv's input_alone_s, input_share and bound_by of one measured run (empty for synthetic input)."""
    if input_alone_s is None:
        return {}
    share = input_alone_s / step_s
    return {"input_alone_s": input_alone_s, "input_share": share,
            "bound_by": "input" if share >= INPUT_BOUND_SHARE else "compute"}
