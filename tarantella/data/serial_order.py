"""The order of the global batches cut from arrays: serial Keras's, when it can be had.

Note [Serial Keras's shuffle order]
`keras.Model.fit(arrays, shuffle=True)` orders the samples with `tf.random.shuffle` inside Keras's
ArrayDataAdapter: the permutation follows from TensorFlow's global seed (`keras.utils.set_random_seed`) and
the op's place in the adapter's map function, nothing else. So when every rank has the same global seed, a
tnt.Model asks Keras's own adapter for the order of the sample *indices* and cuts its global batches from
them: the order is serial's exactly, and equal on every rank, at every rank count (with Keras 3's adapter the
permutation repeats every epoch; that is Keras's behaviour, kept). Without a global seed serial Keras's order
is not reproducible, even serially; the ranks then shuffle with a seed the master draws, the same on all.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
from tensorflow.python.eager import context

from tarantella import collectives, runtime

__all__ = ["shared_shuffle", "index_batches"]


def shared_shuffle() -> tuple[int, bool]:
    """Collective: (a seed drawn by the master, whether every rank can follow serial Keras's order)."""
    drawn = int(np.random.randint(2**31 - 1)) if runtime.is_master_rank() else None
    found = collectives.allgather_object((context.global_seed(), drawn))
    global_seeds = {seed for seed, _ in found}
    seed = next(value for _, value in found if value is not None)
    return seed, len(global_seeds) == 1 and None not in global_seeds


def index_batches(num_samples: int, batch_size: int, shuffle, seed: int, keras_order: bool) -> tf.data.Dataset:
    """Batches of sample indices (int64), the global batches of an epoch, re-drawn at every iteration."""
    if shuffle and keras_order:
        indices = np.arange(num_samples, dtype=np.int64)
        batches = ArrayDataAdapter(indices, batch_size=batch_size, shuffle=shuffle).get_tf_dataset()
        # Keras's adapter builds its batches with flat_map, whose cardinality tf.data cannot tell; said here,
        # so that Keras counts the steps of an epoch as it does for serial arrays (unknown, it would end each
        # epoch with one more call of the train function, which an empty micro-batch answers).
        count = -(-num_samples // batch_size)
        return batches.map(lambda *element: tf.nest.flatten(element)[0]).apply(
            tf.data.experimental.assert_cardinality(count))
    positions = tf.data.Dataset.range(num_samples)
    if shuffle:
        positions = positions.shuffle(num_samples, seed=seed, reshuffle_each_iteration=True)
    # Batches all full: tf.data says so (a static batch size), so the step sees static shapes as plain Keras
    # does and builds no placeholder for an empty micro-batch (Note [Empty micro-batches]).
    return positions.batch(batch_size, drop_remainder=num_samples % batch_size == 0)
