"""The input of a pipelined model: each replica's part of the global batches.

`replica_batches` gives every rank its replica's part of each global batch
(the data-parallel stream of tarantella/data with the replicas as its ranks:
a tf.data pipeline is rewritten so that a replica maps only its own samples,
arrays are gathered row by row), with the batch's global size. The first
stage keeps the inputs, the last stage the targets and sample weights, a
middle stage only the sizes (the parts a stage does not use are dropped from
the stream, so they are never handed to the step; a tf.data map that computes
inputs and targets together still computes both). The step cuts the part into
micro-batches (`micro_batch_bounds`). Shuffling uses a seed shared by all
ranks, so all see the same order. `global_batches` builds the global batches
themselves (arrays cut by `batch_size`, or the user's batched dataset).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tarantella.data import batching, distributed_dataset, user_input
from tarantella.pipelining.schedules import check_micro_batches

__all__ = ["global_batches", "replica_batches", "split_for_validation", "replica_part", "micro_batch_bounds",
           "validation_batches", "check_batches"]

DEFAULT_BATCH_SIZE = 32


def global_batches(x, y=None, sample_weight=None, *, batch_size=None, shuffle=False, seed=0,
                   what="batch_size") -> tf.data.Dataset:
    """A dataset of global batches (x,), (x, y) or (x, y, sample_weight)."""
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError("tarantella: with a tf.data.Dataset, pass targets and sample weights inside the "
                             "dataset, not as `y`/`sample_weight` (as in Keras)")
        if batch_size is not None:
            raise ValueError(f"tarantella: `{what}` cannot be used with a tf.data.Dataset (as in Keras): batch the "
                             f"dataset with the global batch size")
        return x
    if x is None:
        raise TypeError("tarantella: no input data given")
    parts = tuple(part for part in (x, y, sample_weight) if part is not None)
    parts = user_input.as_arrays(parts)
    dataset = tf.data.Dataset.from_tensor_slices(parts)
    if shuffle:
        count = len(keras.tree.flatten(parts)[0])
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size))


def replica_batches(x, y=None, sample_weight=None, *, batch_size=None, shuffle=False, seed=0, keras_order=False,
                    what="batch_size",
                    batch_map=None, num_replicas: int, replica: int, first_stage: bool,
                    last_stage: bool) -> tf.data.Dataset:
    """This replica's part of each global batch of the input (as `global_batches` cuts it), as
    tarantella.data's elements, holding only what this rank's stage uses. `batch_map` (Keras's class
    weights) runs on the global batches: each replica then reads them in full."""
    arrays = not (isinstance(x, tf.data.Dataset) or batch_map is not None)
    if not arrays:
        batches = global_batches(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed, what=what)
        stream = user_input.distribute(batches if batch_map is None else batches.map(batch_map),
                                       size=num_replicas, rank=replica)
    else:  # arrays: a replica gathers its own rows only
        if x is None:
            raise TypeError("tarantella: no input data given")
        x, y, sample_weight = (None if part is None else user_input.as_arrays(part) for part in (x, y, sample_weight))
        # A stage converts and gathers only the parts it uses: the others become columns of nothing (the same
        # rows, so the same batches in the same order), which keep_stage_parts drops. Otherwise every later
        # stage would hold a copy of the whole input x that only the first stage reads.
        x = x if first_stage else _rows_only(x)
        y, sample_weight = (part if last_stage or part is None else _rows_only(part) for part in (y, sample_weight))
        stream = user_input.distribute(x, y, sample_weight, shuffle=shuffle, seed=seed, keras_order=keras_order,
                                       what=what,
                                       batch_size=DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size),
                                       size=num_replicas, rank=replica)

    def keep_stage_parts(element):
        data = element[distributed_dataset.DATA]
        parts = list(data) if isinstance(data, tuple) else [data]
        keep = [first_stage] + [last_stage] * (len(parts) - 1)
        parts = [part if kept else tf.zeros([0]) for part, kept in zip(parts, keep)]
        return {**element, distributed_dataset.DATA: tuple(parts) if isinstance(data, tuple) else parts[0]}

    kept = stream.map(keep_stage_parts)
    # Arrays: the map runs ahead on tf.data's thread instead of inside the step's `next` (measured, 2-stage
    # 8 x Dense(512) at batch 128: Keras's loop outside the step 1.7-1.8 -> 1.3-1.4 ms a step, 4 A/B pairs).
    return kept.prefetch(1) if arrays else kept


def _rows_only(tree):
    """Arrays of the same numbers of rows as `tree`'s, holding nothing."""
    return keras.tree.map_structure(lambda array: np.empty((len(array), 0), np.float32), tree)


def split_for_validation(x, y, sample_weight, validation_split: float):
    """Keras's `validation_split` on arrays: the last fraction (before shuffling) validates."""
    if isinstance(x, tf.data.Dataset):
        raise ValueError("tarantella: validation_split is only supported for array inputs (as in Keras); pass "
                         "validation_data instead")
    count = len(keras.tree.flatten(x)[0])
    at = batching.validation_split_at(count, validation_split)
    cut = lambda part, train: None if part is None else keras.tree.map_structure(  # noqa: E731
        lambda a: np.asarray(a)[:at] if train else np.asarray(a)[at:], part)
    return (cut(x, True), cut(y, True), cut(sample_weight, True)), (cut(x, False), cut(y, False),
                                                                     cut(sample_weight, False))


def replica_part(global_size: int, num_replicas: int, replica: int) -> tuple[int, int]:
    """(first sample, count) of a replica's contiguous part of a global batch."""
    return (batching.micro_batch_offset(global_size, num_replicas, replica),
            batching.micro_batch_size(global_size, num_replicas, replica))


def micro_batch_bounds(count: int, num_micro_batches: int) -> list[tuple[int, int]]:
    """(start, stop) of each micro-batch of a part of `count` samples (the first ones one larger if uneven)."""
    return [(batching.micro_batch_offset(count, num_micro_batches, m),
             batching.micro_batch_offset(count, num_micro_batches, m)
             + batching.micro_batch_size(count, num_micro_batches, m)) for m in range(num_micro_batches)]


def check_batches(x, batch_size, num_replicas: int, num_micro_batches: int) -> None:
    """Before training: arrays cut into global batches (the last one possibly smaller) that the replicas'
    micro-batches must divide; a dataset's batches are checked at each step."""
    if x is None or isinstance(x, tf.data.Dataset):
        return
    count = len(keras.tree.flatten(x)[0])
    size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    for batch in {min(size, count), count % size} - {0}:
        check_micro_batches(batch, num_replicas, num_micro_batches)


def validation_batches(validation_data, batch_size, **replica_input) -> tf.data.Dataset:
    """fit's validation_data as replica_batches: a Dataset keeps its own batches, arrays take `batch_size`."""
    x, y, sample_weight = user_input.unpack_validation_data(validation_data)
    return replica_batches(x, y, sample_weight, batch_size=None if isinstance(x, tf.data.Dataset) else batch_size,
                           **replica_input)
