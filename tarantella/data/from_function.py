"""`distribute_datasets_from_function`: each rank builds its own pipeline (file-level sharding).

    def dataset_fn(context: tf.distribute.InputContext):
        files = tf.data.Dataset.list_files(pattern, shuffle=False).shard(
            context.num_input_pipelines, context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
        return files.interleave(tf.data.TFRecordDataset).map(parse).batch(batch, drop_remainder=True)

    model.fit(tnt.distribute_datasets_from_function(dataset_fn), epochs=...)

The opt-in for when even the cheap part of reading everything is too much:
as with tf.distribute's function of the same name, the user accepts that a
global batch is no longer serial's (it is the ranks' batches together).
`dataset_fn` gets a `tf.distribute.InputContext` (the same class, so existing
functions run unchanged) and returns this rank's batches. A rank's batch of n
samples counts as n / (n * ranks) of the global batch, i.e. every rank weighs
1/N (tf.distribute's `compute_average_loss` rule). Every rank must yield the
same number of batches (a rank that stops early would leave the others
waiting): the counts are compared at once where tf.data knows them, and an
unknown count is accepted with a warning. `predict` returns the ranks'
predictions in rank order.
"""
from __future__ import annotations

import logging

import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.data import distributed_dataset

__all__ = ["distribute_datasets_from_function"]

logger = logging.getLogger("tarantella")

_RANK_STRIDE = 2**40  # predict orders positions rank-major: rank r's samples come after all of rank r-1's


def distribute_datasets_from_function(dataset_fn, *, size: int | None = None, rank: int | None = None):
    """This rank's stream for fit/evaluate/predict (and tnt.distribute_dataset) from `dataset_fn(context)`,
    which must return a batched tf.data.Dataset of this rank's batches."""
    size = runtime.get_size() if size is None else size
    rank = runtime.get_rank() if rank is None else rank
    context = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=rank,
                                         num_replicas_in_sync=size)
    dataset = dataset_fn(context)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"tarantella: dataset_fn must return a tf.data.Dataset of this rank's batches, got "
                        f"{type(dataset).__name__}")
    _check_equal_lengths(int(dataset.cardinality()), size)

    def with_facts(offset, batch):
        local = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        return offset + local, {distributed_dataset.DATA: batch, distributed_dataset.GLOBAL_SIZE: local * size,
                                distributed_dataset.FIRST_INDEX: rank * _RANK_STRIDE + offset}

    return dataset.scan(tf.constant(0, tf.int64), with_facts)


def _check_equal_lengths(cardinality: int, size: int) -> None:
    if size == 1:
        return
    counts = collectives.allgather_object(cardinality)
    known = {count for count in counts if count >= 0 or count == tf.data.INFINITE_CARDINALITY}
    if len(known) > 1 and tf.data.UNKNOWN_CARDINALITY not in counts:
        raise ValueError(f"tarantella: the ranks' datasets from dataset_fn have different numbers of batches "
                         f"({', '.join(f'rank {r}: {c}' for r, c in enumerate(counts))}); every rank must run the "
                         f"same number of steps: shard so that the counts agree, batch with drop_remainder=True, "
                         f"or repeat() and give steps_per_epoch")
    if tf.data.UNKNOWN_CARDINALITY in counts and runtime.is_master_rank():
        logger.warning("tarantella: the number of batches of dataset_fn's datasets is unknown; every rank must "
                       "yield the same number of batches (or repeat() and give steps_per_epoch), or the job hangs")
