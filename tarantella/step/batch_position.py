"""Where this rank's micro-batch sits in the global batch, for the layers that look at the batch.

While tarantella traces a step (train, test or predict, data parallel), `current()` says which rows of the
global batch this rank runs: serial semantics need it where a layer's result depends on the other samples
of the batch or on a sample's position in it (tarantella/step/serial_random.py draws each sample's random
values at its serial position; tarantella/step/global_batch_norm.py normalises with the global batch's
statistics). Outside such a trace (plain Keras, eager calls, tf.data functions) `current()` is None and
those layers behave as Keras's own.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import keras
import tensorflow as tf

from tarantella import runtime
from tarantella.data import distributed_dataset

__all__ = ["BatchPosition", "current", "tracing_step", "of_step", "of_rows", "check_batch_norm",
           "LOCAL_BATCH_NORM", "GLOBAL_BATCH_NORM"]

GLOBAL_BATCH_NORM = "global"  # BatchNormalization over the global batch (the default; serial semantics)
LOCAL_BATCH_NORM = "local"    # each rank's micro-batch statistics (the documented opt-out)


def check_batch_norm(batch_norm: str) -> str:
    """A model's batch_norm choice, or a one-line error naming the choices."""
    if batch_norm not in (GLOBAL_BATCH_NORM, LOCAL_BATCH_NORM):
        raise ValueError(f"tarantella: batch_norm={batch_norm!r} is not a choice; use \"global\" (the global "
                         f"batch's statistics, as serial Keras) or \"local\" (each rank's micro-batch's)")
    return batch_norm


@dataclasses.dataclass(frozen=True)
class BatchPosition:
    """This rank's rows [start, start + rows) of a global batch of `global_size` samples (int64 tensors).

    `rows` counts the rows the step runs, so an empty micro-batch's placeholder (Note [Empty micro-batches])
    counts 1; `samples` counts the real ones (0 then), which is what the batch's statistics weigh."""
    start: tf.Tensor
    rows: tf.Tensor
    samples: tf.Tensor
    global_size: tf.Tensor
    static_rows: int | None
    world_size: int               # the ranks whose samples share BatchNormalization's statistics
    batch_norm: str
    statistics_allreduce: object  # callable(tensor) -> its sum over those ranks; None: the statistics of the
                                  # rows this call runs (Keras's own)
    rank: int = 0                 # this rank's index among them
    piece_statistics: object = None  # exact mode's recorder of each virtual micro-batch's moments
                                     # (tarantella/_repro/exact_batch_norm.py)


_state = threading.local()


def current() -> BatchPosition | None:
    """The position of the step being traced in this thread, or None."""
    return getattr(_state, "position", None)


@contextlib.contextmanager
def tracing_step(position: BatchPosition | None):
    """Within: layers traced in this thread see `position` (None: no serial-semantics rewriting)."""
    previous = current()
    _state.position = position
    try:
        yield
    finally:
        _state.position = previous


def of_step(model, batch, global_size, samples) -> BatchPosition | None:
    """The position of `batch` (as the step runs it, placeholder included) holding `samples` of this rank's
    samples of a global batch of `global_size`, for tnt.Model `model` (its world size, batch_norm mode and
    statistics_allreduce); None on one rank, whose step is plain Keras's."""
    if model.world_size == 1:
        return None
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    global_size = tf.cast(global_size, tf.int64)
    start, _ = distributed_dataset.rank_start_count(global_size, model.world_size, runtime.get_rank())
    static_rows = first.shape[0]
    return BatchPosition(start=start, rows=tf.shape(first, out_type=tf.int64)[0], samples=tf.cast(samples, tf.int64),
                         global_size=global_size, static_rows=static_rows, world_size=model.world_size,
                         batch_norm=model.batch_norm, statistics_allreduce=model.statistics_allreduce,
                         rank=runtime.get_rank())


def of_rows(start: int, rows: int, global_size: int, *, world_size: int, rank: int, batch_norm: str,
            statistics_allreduce) -> BatchPosition:
    """The position of rows [start, start + rows) of a global batch of `global_size`, all known when tracing
    (a pipeline's micro-batch: tarantella/pipelining/compiled_step.py)."""
    constant = lambda value: tf.constant(value, tf.int64)  # noqa: E731
    return BatchPosition(start=constant(start), rows=constant(rows), samples=constant(rows),
                         global_size=constant(global_size), static_rows=rows, world_size=world_size,
                         batch_norm=batch_norm, statistics_allreduce=statistics_allreduce, rank=rank)
