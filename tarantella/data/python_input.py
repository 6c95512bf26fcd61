"""Keras's Python inputs, `keras.utils.PyDataset` and generators, as this rank's stream of micro-batches.

Note [Reading a PyDataset per rank]
A PyDataset's unit is the global batch (`__getitem__(i)` returns batch i), and
it can be asked for any batch in any order. So in each group of N consecutive
batches of the epoch's order, rank r reads batch kN+r only, cuts it into the N
micro-batches (tarantella/data/batching.py) and one all-to-all exchange
(batch_exchange.py) gives every rank its micro-batch of each of the group's
batches: each rank does about 1/N of the `__getitem__` work and receives about
1/N of the bytes, while every global batch keeps exactly serial's samples, in
serial's order. A last group of fewer than N batches is read by its first
ranks (the others read nothing and still receive their parts); a partial last
batch gives the last ranks empty micro-batches (Note [Empty micro-batches] in
tarantella/step/empty_micro_batch.py). The batch order (shuffled per epoch
when fit's `shuffle` is true) comes from a seed shared by all ranks; the first
batch is peeked at on the master only (for the element structure, as Keras
peeks) and its structure broadcast.
The exchange is a collective, so every rank must make the same exchanges: the
stream is pulled only as the steps consume it (no read-ahead of tf.data after
the exchange: a rank ahead of the others when Keras drops the iterator, after
`steps_per_epoch` steps, would wait for peers that never come). The reading
itself runs ahead: a PyDataset's `workers`, `use_multiprocessing` and
`max_queue_size` are honoured as Keras's own enqueuer does (this rank's
batches fetched ahead by threads or forked processes, given out in order).
`on_epoch_begin` runs on every rank when a pass starts, `on_epoch_end` once it
has read its last batch, and once before the first pass of fit and evaluate
(as Keras resets its data; not of predict). Both run on every rank, so a
PyDataset that shuffles its own samples there stays in step on all ranks if it
does so with a seed, the same on every rank (e.g. `np.random.default_rng(seed)`
kept in the dataset). No rank reads another's batches, so the batches cannot be
compared (the order check of order_check.py covers tf.data and generators);
instead every rank's epoch callbacks run at the same point of the stream, and
if one draws from numpy's or Python's global random generator while their
states differ between ranks (unseeded, or moved on differently by
augmentations in `__getitem__`, which each rank runs on other batches), every
rank stops with an error naming the fix. A generator of the dataset's own that
is unseeded cannot be seen.

A generator can only give its next global batch (it cannot skip), so every
rank builds every global batch and keeps its part (one note on the master says
so): make its elements cheap (e.g. file names decoded in a tf.data map) or use
`tnt.distribute_datasets_from_function` to shard at file level. It must give
the same batches in the same order on every rank (Note [Same order on every
rank] in order_check.py checks every batch).

As in Keras: elements are `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`
(lists count as tuples; any nesting of tuples and dicts of arrays); a
generator is consumed once over all epochs (give `steps_per_epoch` for
several epochs).
"""
from __future__ import annotations

import collections
import concurrent.futures
import functools
import itertools
import multiprocessing
import pickle
import random
import zlib

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.data import batch_exchange, batching, distributed_dataset, order_check

__all__ = ["is_py_dataset", "is_generator", "from_py_dataset", "py_dataset_for_rank", "from_generator",
           "GENERATOR_NOTE"]

GENERATOR_NOTE = ("tarantella: a Python generator yields whole global batches one after the other (it cannot skip), "
                  "so every rank builds each global batch and keeps its part; to read only this rank's samples use a "
                  "keras.utils.PyDataset, a tf.data pipeline (per-sample work in map() before batch()) or "
                  "tnt.distribute_datasets_from_function")


def is_py_dataset(x) -> bool:
    return isinstance(x, keras.utils.PyDataset)


def is_generator(x) -> bool:
    """A Python iterator (generator, iter(...)) that is not an array or a tf.data.Dataset."""
    return hasattr(x, "__next__") and hasattr(x, "__iter__") and not isinstance(x, (np.ndarray, tf.data.Dataset))


def _standardize(batch):
    """Keras's element forms as tf.data structures (a list of parts is a tuple, arrays become tensors; a bare
    array is `(x,)`, as Keras's PyDataset adapter hands it to the model)."""
    if isinstance(batch, list):
        batch = tuple(batch)
    elif isinstance(batch, (np.ndarray, tf.Tensor)):
        batch = (batch,)
    return tf.nest.map_structure(lambda leaf: np.asarray(leaf) if not isinstance(leaf, tf.Tensor) else leaf,
                                 batch)


def _signature(batch):
    """The tf.TypeSpec of a batch, its first (batch) dimension left open."""
    def spec(leaf):
        leaf = tf.convert_to_tensor(leaf)
        return tf.TensorSpec([None] + leaf.shape[1:], leaf.dtype)
    return tf.nest.map_structure(spec, batch)


def _epochs(py_dataset: keras.utils.PyDataset, count: int, shuffle: bool, seed: int, keras_reset: bool,
            call=lambda callback: callback()):
    """Each pass's batch order; calls the dataset's on_epoch_begin (and before the first pass, with
    `keras_reset`, on_epoch_end: Keras's fit and evaluate reset their data that way before the first epoch),
    each through `call`."""
    for epoch in itertools.count():
        if epoch == 0 and keras_reset:
            call(py_dataset.on_epoch_end)
        order = np.arange(count)
        if shuffle:
            np.random.default_rng([seed, epoch]).shuffle(order)
        call(py_dataset.on_epoch_begin)
        yield [int(index) for index in order]


def _global_random_state() -> int:
    """A digest of Python's and numpy's global random generators (what an unseeded `np.random.shuffle` or
    `random.shuffle` in a PyDataset's epoch callback draws from)."""
    return zlib.crc32(pickle.dumps((random.getstate(), np.random.get_state())))


def _called_in_step(callback, size: int) -> None:
    """Collective (every rank at the same point of its stream): run a PyDataset's epoch callback; if it drew
    from the global random generators on some rank and their states differ between ranks, every rank raises
    (Note [Reading a PyDataset per rank]: each batch is read by one rank only, so orders drawn differently
    would lose and repeat samples)."""
    before = _global_random_state()
    callback()
    drew = _global_random_state() != before
    views = batch_exchange.exchange([(before, drew)] * size)
    if any(drew for _, drew in views) and len({state for state, _ in views}) > 1:
        raise order_check.OrderMismatchError(
            f"tarantella: the PyDataset's {callback.__name__}() draws from numpy's or Python's global random "
            f"generator, whose state differs between ranks, so the ranks would read batches of different orders "
            f"and samples would be lost and repeated; shuffle with a generator of the dataset's own, seeded the "
            f"same on every rank (self.rng = np.random.default_rng(42); self.rng.shuffle(...))")


def _length(py_dataset: keras.utils.PyDataset) -> int:
    count = py_dataset.num_batches
    if count is None:
        raise ValueError("tarantella: a PyDataset without __len__ (num_batches None) is not supported yet; give it "
                         "a length, or wrap an infinite source in a generator with steps_per_epoch")
    return count


def from_py_dataset(py_dataset: keras.utils.PyDataset, shuffle: bool, seed: int,
                    keras_reset: bool = True) -> tf.data.Dataset:
    """The global batches of `py_dataset` (all of them: a single rank's input); with `shuffle`, batch order
    permuted per epoch. on_epoch_end runs once a pass has read its last batch."""
    count = _length(py_dataset)
    first = _standardize(py_dataset[0])
    epochs = _epochs(py_dataset, count, shuffle, seed, keras_reset)

    def batches():
        for position, batch in enumerate(_fetched(py_dataset, next(epochs))):
            if position == count - 1:
                py_dataset.on_epoch_end()
            yield _standardize(batch)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(first))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def py_dataset_for_rank(py_dataset: keras.utils.PyDataset, shuffle: bool, seed: int, size: int, rank: int,
                        keras_reset: bool = True) -> tf.data.Dataset:
    """This rank's micro-batches (distributed elements) of `py_dataset`, each rank reading about 1/`size` of
    its batches (Note [Reading a PyDataset per rank]). Collective: every rank calls it at the same point."""
    count = _length(py_dataset)
    batch_exchange.prepare()
    master = runtime.get_master_rank()
    signature = collectives.broadcast_object(_signature(_standardize(py_dataset[0])) if rank == master else None,
                                             root=master)
    call = functools.partial(_called_in_step, size=size)
    epochs = _epochs(py_dataset, count, shuffle, seed, keras_reset, call)

    def micro_batches():
        order = next(epochs)
        fetched = _fetched(py_dataset, order[rank::size])  # batch kN+r of each group: this rank's to read
        try:
            for first in range(0, count, size):
                readers = min(size, count - first)
                own = _standardize(next(fetched)) if rank < readers else None
                received = batch_exchange.exchange(_cut(own, size, signature))
                if first + size >= count:  # every batch of the pass is read
                    call(py_dataset.on_epoch_end)
                for data, total in received[:readers]:
                    yield tf.nest.pack_sequence_as(signature, data), total
        finally:
            fetched.close()

    element = (signature, tf.TensorSpec([], tf.int64))
    stream = tf.data.Dataset.from_generator(micro_batches, output_signature=element)
    stream = stream.scan(tf.constant(0, tf.int64), functools.partial(
        distributed_dataset.as_distributed_element, size=size, rank=rank, total=None))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # pulled only as the steps consume it (Note above)
    return stream.apply(tf.data.experimental.assert_cardinality(count)).with_options(options)


def _cut(batch, size: int, signature) -> list:
    """A global batch as `size` pieces (flat lists of arrays, with the batch's size), piece s rank s's micro-batch;
    `size` Nones for no batch."""
    if batch is None:
        return [None] * size
    tf.nest.assert_same_structure(signature, batch)
    leaves = tf.nest.flatten(batch)
    total = len(leaves[0])
    pieces = []
    for part in range(size):
        start = batching.micro_batch_offset(total, size, part)
        end = start + batching.micro_batch_size(total, size, part)
        pieces.append(([np.ascontiguousarray(leaf[start:end]) for leaf in leaves], np.int64(total)))
    return pieces


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
