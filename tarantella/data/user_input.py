"""What `fit`/`evaluate`/`predict` accept, turned into this rank's micro-batch stream.

Accepted, as in Keras: a batched tf.data.Dataset (each element a global batch);
an unbatched one with `tnt_micro_batch_size` (global batch = that times the
rank count); numpy arrays, lists/tuples/dicts of arrays, with `batch_size` (the
global batch size, default 32 as in Keras).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella.data import batching, distributed_dataset

__all__ = ["distribute", "split_for_validation"]

DEFAULT_BATCH_SIZE = 32


def _is_arrays(value) -> bool:
    leaves = tf.nest.flatten(value)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) or hasattr(leaf, "__array__")
                                for leaf in leaves)


def _as_arrays(value):
    return tf.nest.map_structure(np.asarray, value)


def distribute(x, y=None, sample_weight=None, *, batch_size=None, micro_batch_size=None, shuffle=False,
               seed=0, class_weight=None, size: int, rank: int, what: str = "batch_size") -> tf.data.Dataset:
    """This rank's micro-batches of the user's data (see tarantella.data.distributed_dataset)."""
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError("tarantella: with a tf.data.Dataset, pass targets and sample weights inside the "
                             "dataset, not as `y`/`sample_weight` (as in Keras)")
        if class_weight:
            raise ValueError("tarantella: class_weight is supported for array inputs only; fold the weights "
                             "into the dataset as sample weights")
        if micro_batch_size is not None:
            return distributed_dataset.from_unbatched_dataset(x, micro_batch_size, size, rank)
        if batch_size is not None:
            raise ValueError(f"tarantella: `{what}` cannot be used with a tf.data.Dataset (as in Keras): batch "
                             f"the dataset with the global batch size, or pass it unbatched with "
                             f"tnt_micro_batch_size")
        return distributed_dataset.from_batched_dataset(x, size, rank)
    if x is None or not _is_arrays(x):
        raise TypeError(f"tarantella: unsupported input of type {type(x).__name__}: pass numpy arrays (or "
                        f"lists/dicts of them) or a tf.data.Dataset")
    if micro_batch_size is not None:
        if batch_size is not None:
            raise ValueError(f"tarantella: pass either `{what}` (global) or the micro-batch size, not both")
        batch_size = micro_batch_size * size
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    batching.check_global_batch_size(batch_size, size, what)
    x = _as_arrays(x)
    if class_weight:
        if y is None:
            raise ValueError("tarantella: class_weight needs targets `y`")
        weights = distributed_dataset.class_weights_as_sample_weights(y, class_weight)
        sample_weight = weights if sample_weight is None else np.asarray(sample_weight) * weights
    parts = (x,) + tuple(_as_arrays(part) for part in (y, sample_weight) if part is not None)
    return distributed_dataset.from_arrays(parts, batch_size, shuffle, seed, size, rank)


def split_for_validation(x, y, sample_weight, validation_split: float):
    """Keras's `validation_split` on arrays: the last fraction (before shuffling) validates."""
    if isinstance(x, tf.data.Dataset):
        raise ValueError("tarantella: validation_split is only supported for array inputs (as in Keras); "
                         "pass validation_data instead")
    x, y, sample_weight = (None if part is None else _as_arrays(part) for part in (x, y, sample_weight))
    at = batching.validation_split_at(len(tf.nest.flatten(x)[0]), validation_split)

    def cut(part, train):
        if part is None:
            return None
        return tf.nest.map_structure(lambda array: array[:at] if train else array[at:], part)

    return (cut(x, True), cut(y, True), cut(sample_weight, True)), (cut(x, False), cut(y, False),
                                                                     cut(sample_weight, False))
