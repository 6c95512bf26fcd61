"""Keras's Python inputs, `keras.utils.PyDataset` and generators, as tf.data pipelines of global batches.

What each rank can skip: a PyDataset's unit is the whole global batch
(`__getitem__(i)` returns batch i), and a generator's next element is the next
global batch: neither lets a rank ask for only its samples. So every rank
builds every global batch and keeps its part (one note on the master says so);
for a PyDataset, make `__getitem__` cheap (e.g. return file names and decode
in a tf.data map) or use `tnt.distribute_datasets_from_function` to shard at
file level. A generator must give the same batches in the same order on every
rank (Note [Same order on every rank] in order_check.py checks the first one).

As in Keras: elements are `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`
(lists count as tuples); a PyDataset's batch order is shuffled each epoch when
fit's `shuffle` is true (here with a seed shared by all ranks), its
`on_epoch_begin`/`on_epoch_end` run around each epoch; a generator is consumed
once over all epochs (give `steps_per_epoch` for several epochs).
"""
from __future__ import annotations

import itertools

import keras
import numpy as np
import tensorflow as tf

__all__ = ["is_py_dataset", "is_generator", "from_py_dataset", "from_generator", "NOTE"]

NOTE = ("tarantella: a {kind} yields whole global batches, so every rank builds each global batch and keeps its "
        "part; to read only this rank's samples use a tf.data pipeline (per-sample work in map() before batch()) or "
        "tnt.distribute_datasets_from_function")


def is_py_dataset(x) -> bool:
    return isinstance(x, keras.utils.PyDataset)


def is_generator(x) -> bool:
    """A Python iterator (generator, iter(...)) that is not an array or a tf.data.Dataset."""
    return hasattr(x, "__next__") and hasattr(x, "__iter__") and not isinstance(x, (np.ndarray, tf.data.Dataset))


def _standardize(batch):
    """Keras's element forms as tf.data structures (a list of parts is a tuple, arrays become tensors)."""
    if isinstance(batch, list):
        batch = tuple(batch)
    return tf.nest.map_structure(lambda leaf: np.asarray(leaf) if not isinstance(leaf, tf.Tensor) else leaf,
                                 batch)


def _signature(batch):
    """The tf.TypeSpec of a batch, its first (batch) dimension left open."""
    def spec(leaf):
        leaf = tf.convert_to_tensor(leaf)
        return tf.TensorSpec([None] + leaf.shape[1:], leaf.dtype)
    return tf.nest.map_structure(spec, batch)


def from_py_dataset(py_dataset: keras.utils.PyDataset, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The global batches of `py_dataset`; with `shuffle`, batch order permuted per epoch (same on all ranks)."""
    count = py_dataset.num_batches
    if count is None:
        raise ValueError("tarantella: a PyDataset without __len__ (num_batches None) is not supported yet; give it "
                         "a length, or wrap an infinite source in a generator with steps_per_epoch")
    first = _standardize(py_dataset[0])
    epochs = itertools.count()

    def batches():
        epoch = next(epochs)
        order = np.arange(count)
        if shuffle:
            np.random.default_rng([seed, epoch]).shuffle(order)
        py_dataset.on_epoch_begin()
        for index in order:
            yield _standardize(py_dataset[int(index)])
        py_dataset.on_epoch_end()

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(first))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def from_generator(generator) -> tf.data.Dataset:
    """The global batches a Python generator yields (it is peeked at once for the element structure)."""
    try:
        first = _standardize(next(generator))
    except StopIteration:
        raise ValueError("tarantella: the generator given as input yields nothing") from None
    pending = [first]

    def batches():
        while pending:
            yield pending.pop()
        for batch in generator:
            yield _standardize(batch)

    return tf.data.Dataset.from_generator(batches, output_signature=_signature(first))
