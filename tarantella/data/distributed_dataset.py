"""The stream of this rank's micro-batches: its element format, and the arithmetic on tensors.

Every element of such a stream is a dict: the
rank's micro-batch (`tnt_data`, in the usual Keras `(x, y, sample_weight)`
form), the size of the global batch it came from, and the position of the
micro-batch's first sample in the epoch. The step functions use the global
size to weight this rank's loss (Note [Loss of the global batch]) and
`predict` uses the position to put results back in input order.

Large arrays are never copied whole: `from_arrays` gathers each step's
micro-batch from the user's arrays by index. All ranks must see the same
sequence of global batches (Note [Same order on every rank] in order_check.py).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella.data import batching, exact_blocks, order_check, serial_order

__all__ = ["DATA", "GLOBAL_SIZE", "FIRST_INDEX", "is_distributed_element", "rank_range", "rank_start_count",
           "as_distributed_element", "sliced_for_rank", "from_arrays", "class_weights_as_sample_weights"]

DATA = "tnt_data"
GLOBAL_SIZE = "tnt_global_size"
FIRST_INDEX = "tnt_first_index"


def is_distributed_element(data) -> bool:
    return isinstance(data, dict) and DATA in data and GLOBAL_SIZE in data


def rank_range(batch, size: int, rank: int):
    """(global batch size, start, count) of this rank's contiguous part of a global batch (int64 tensors)."""
    total = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
    return (total,) + rank_start_count(total, size, rank)


def rank_start_count(total, size: int, rank: int):
    """(start, count) of this rank's part of a global batch of `total` samples (int64 tensors), as
    batching.micro_batch_offset and micro_batch_size give them for a size known in Python."""
    base, extra = total // size, total % size
    count = base + tf.cast(rank < extra, tf.int64)
    start = rank * base + tf.minimum(tf.constant(rank, tf.int64), extra)
    virtual_batches = exact_blocks.virtual_batches_from_environment()
    if virtual_batches and size > 1:   # exact mode: a multiple of V splits at the blocks' edges (Note there)
        block = exact_blocks.rank_blocks(virtual_batches, size)[rank]
        piece = total // virtual_batches
        whole = tf.equal(total % virtual_batches, 0)
        start = tf.where(whole, block.start * piece, start)
        count = tf.where(whole, len(block) * piece, count)
    return start, count


def _slice_for_rank(batch, size: int, rank: int):
    """This rank's contiguous part of a global batch (tensors), with the batch's size and the part's start."""
    total, start, count = rank_range(batch, size, rank)
    part = tf.nest.map_structure(lambda tensor: tensor[start:start + count], batch)
    static_total = tf.nest.flatten(batch)[0].shape[0]
    if static_total is not None:
        # Every global batch has this size (tf.data says so): keep the micro-batch's shape static too,
        # as plain Keras would see it; TensorFlow runs fully static shapes faster.
        static_count = batching.micro_batch_size(static_total, size, rank)
        for tensor in tf.nest.flatten(part):
            tensor.set_shape([static_count] + tensor.shape[1:])
    return part, total, start


def sliced_for_rank(dataset: tf.data.Dataset, size: int, rank: int, fingerprint=None) -> tf.data.Dataset:
    """Each element of `dataset` is a global batch, read in full; keep this rank's part of each.
    (The fallback for pipelines tarantella/data/rank_pipeline.py cannot rewrite.) With a fingerprint
    (order_check.Fingerprint), every global batch is folded into it."""
    def take_part(state, batch):
        offset, position, folded = state
        if fingerprint is not None:
            folded = fingerprint.fold(position, folded, order_check.batch_hash(batch))
        part, total, start = _slice_for_rank(batch, size, rank)
        return (offset + total, position + 1, folded), {DATA: part, GLOBAL_SIZE: total, FIRST_INDEX: offset + start}

    start = fingerprint.start() if fingerprint is not None else tf.constant(0, tf.int64)
    return dataset.scan((tf.constant(0, tf.int64), tf.constant(0, tf.int64), start), take_part)


def as_distributed_element(offset, micro_batch, *, size: int, rank: int, total: int | None):
    """In a tf.data scan from offset 0: a micro-batch, given as `(data, global batch size)` (or `data` alone
    with `total`, the global batch size when every batch is full), as a distributed element. Positions count
    global batches in the order they finally come out (after a batch-level shuffle)."""
    if total is None:
        data, total = micro_batch
    else:
        data, total = micro_batch, tf.constant(total, tf.int64)
    start, _ = rank_start_count(total, size, rank)
    return offset + total, {DATA: data, GLOBAL_SIZE: total, FIRST_INDEX: offset + start}


# Inputs from this size on are read in place (from_arrays): below it a whole copy costs little memory and
# saves a Python call per micro-batch (~0.2 ms on the 2-core machine: the digits MLP's 0.9 ms step at 1 rank
# took 26 % longer than plain Keras's read in place, 4 % copied; `python -m bench.fixed_cost --models
# digits_mlp:32 --configs paired:1`).
READ_IN_PLACE_FROM = 16 << 20


def from_arrays(arrays, batch_size: int, shuffle, seed: int, size: int, rank: int,
                keras_order: bool = False) -> tf.data.Dataset:
    """`arrays`: a structure (tuple/dict) of arrays with equal first dimensions, cut into global batches of
    `batch_size`, in the same order on every rank when `shuffle`: serial Keras's with `keras_order`, else
    reshuffled every epoch with `seed` (Note [Serial Keras's shuffle order]).

    Large numeric arrays stay the user's: each micro-batch's rows are gathered from them by numpy, not from a
    TensorFlow copy of the whole input, which would add the input's size to every rank's memory (smaller
    ones are copied once: READ_IN_PLACE_FROM)."""
    arrays = tf.nest.map_structure(np.asarray, arrays)
    leaves = tf.nest.flatten(arrays)
    num_samples = int(leaves[0].shape[0])
    in_place = (sum(leaf.nbytes for leaf in leaves) >= READ_IN_PLACE_FROM
                and all(leaf.dtype.kind in "biuf" for leaf in leaves))
    if in_place:
        dtypes = [tf.as_dtype(leaf.dtype) for leaf in leaves]

        def rows(part):
            return [np.ascontiguousarray(leaf[part]) for leaf in leaves]

        def gather(part):
            gathered = tf.numpy_function(rows, [part], dtypes, stateful=False)
            for tensor, leaf in zip(gathered, leaves):
                tensor.set_shape(part.shape[:1] + leaf.shape[1:])
            return tf.nest.pack_sequence_as(arrays, gathered)
    else:
        tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)

        def gather(part):
            return tf.nest.map_structure(lambda tensor: tf.gather(tensor, part), tensors)

    def gather_part(batch_number, batch_positions):
        part, total, start = _slice_for_rank(batch_positions, size, rank)
        return {DATA: gather(part), GLOBAL_SIZE: total, FIRST_INDEX: batch_number * batch_size + start}

    positions = serial_order.index_batches(num_samples, batch_size, shuffle, seed, keras_order)
    return positions.enumerate().map(gather_part).prefetch(tf.data.AUTOTUNE)


def class_weights_as_sample_weights(y, class_weight: dict):
    """Keras's rule: a sample's weight is its class's weight (class = y, or argmax of one-hot y)."""
    y = np.asarray(y)
    classes = y.argmax(axis=-1) if y.ndim == 2 and y.shape[-1] > 1 else y.reshape(len(y), -1)[:, 0]
    table = np.array([class_weight.get(c, 1.0) for c in range(int(classes.max()) + 1)], dtype=np.float32)
    return table[classes.astype(np.int64)]
