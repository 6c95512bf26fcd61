"""Global batches for a pipelined model.

Every rank of a pipeline iterates the same global batches (stage 0 needs the
inputs, the last stage the targets; the others only the batch sizes); each
rank then takes its replica's part and cuts it into micro-batches
(`micro_batches`). Shuffling uses a seed shared by all ranks, so all see the
same order.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tarantella.data import batching

__all__ = ["global_batches", "split_for_validation", "replica_part", "micro_batch_bounds"]

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
    parts = _lists_as_tuples(keras.tree.map_structure(np.asarray, parts))
    dataset = tf.data.Dataset.from_tensor_slices(parts)
    if shuffle:
        count = len(keras.tree.flatten(parts)[0])
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size))


def _lists_as_tuples(tree):
    """tf.data stacks a list of arrays into one tensor; a tuple stays a structure."""
    if isinstance(tree, (list, tuple)):
        return tuple(_lists_as_tuples(item) for item in tree)
    if isinstance(tree, dict):
        return {key: _lists_as_tuples(value) for key, value in tree.items()}
    return tree


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
