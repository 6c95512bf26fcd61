"""Keras's Python inputs, `keras.utils.PyDataset` and generators, as tf.data pipelines of global batches.

What each rank can skip: a PyDataset's unit is the whole global batch
(`__getitem__(i)` returns batch i), and a generator's next element is the next
global batch: neither lets a rank ask for only its samples. So every rank
builds every global batch and keeps its part (one note on the master says so);
for a PyDataset, make `__getitem__` cheap (e.g. return file names and decode
in a tf.data map) or use `tnt.distribute_datasets_from_function` to shard at
file level. A generator must give the same batches in the same order on every
rank (Note [Same order on every rank] in order_check.py checks every batch).

A PyDataset's `workers`, `use_multiprocessing` and `max_queue_size` are
honoured as Keras's own enqueuer does (batches fetched ahead by threads or
forked processes, given out in order).

As in Keras: elements are `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`
(lists count as tuples); a PyDataset's batch order is shuffled each epoch when
fit's `shuffle` is true (here with a seed shared by all ranks), its
`on_epoch_begin`/`on_epoch_end` run around each epoch; a generator is consumed
once over all epochs (give `steps_per_epoch` for several epochs).
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import multiprocessing

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
        for batch in _fetched(py_dataset, [int(index) for index in order]):
            yield _standardize(batch)
        py_dataset.on_epoch_end()

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(first))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def _fetched(py_dataset: keras.utils.PyDataset, order: list[int]):
    """py_dataset[i] for i in order, in order. As Keras's own enqueuer: with `workers` > 1 (threads, or
    processes with `use_multiprocessing`) up to `max_queue_size` batches are fetched ahead, concurrently."""
    workers = int(getattr(py_dataset, "workers", 1) or 1)
    processes = bool(getattr(py_dataset, "use_multiprocessing", False))
    if workers <= 1 and not processes:
        for index in order:
            yield py_dataset[index]
        return
    ahead = max(int(getattr(py_dataset, "max_queue_size", 10) or 10), workers)
    if processes:
        # Forked like Keras's own worker processes (the children inherit the dataset and run only its
        # __getitem__: keep TensorFlow and MPI out of it).
        global _SHARED
        _SHARED = py_dataset
        pool = multiprocessing.get_context("fork").Pool(workers)
        submit = lambda index: pool.apply_async(_get_shared, (index,))  # noqa: E731
        result = lambda pending: pending.get()  # noqa: E731
    else:
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tnt_py_dataset")
        submit = lambda index: pool.submit(py_dataset.__getitem__, index)  # noqa: E731
        result = lambda pending: pending.result()  # noqa: E731
    try:
        queue = collections.deque(submit(index) for index in order[:ahead])
        for index in order[ahead:] + [None] * len(queue):
            batch = result(queue.popleft())
            if index is not None:
                queue.append(submit(index))
            yield batch
    finally:
        if processes:
            pool.terminate()
        else:
            pool.shutdown(wait=True, cancel_futures=True)


_SHARED: keras.utils.PyDataset | None = None  # the dataset forked worker processes read


def _get_shared(index: int):
    return _SHARED[index]


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
