"""Distributing a custom training loop (the public names tnt.distribute_dataset,
tnt.reduce_gradients and tnt.broadcast_variables); examples/custom_loop.py shows them together.

    dataset = tnt.distribute_dataset(global_batches)        # this rank's (micro_batch, share)
    tnt.broadcast_variables(model.variables)                 # every rank starts from the master's
    @tf.function
    def step(batch, share):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))       # the mean over this rank's micro-batch
        grads = tape.gradient(loss, model.trainable_variables)
        grads = tnt.reduce_gradients(grads, model.trainable_variables, share=share)
        optimizer.apply(grads, model.trainable_variables)

With `share` = n_r / N (this rank's part of the global batch) the reduced
gradients are those of the global batch's mean loss, as in serial training
(Note [Loss of the global batch] in tf_steps.py). Without it, the mean over the
ranks (Horovod's DistributedGradientTape). The reduction runs in the fused
reducer, its buckets starting while backprop still runs, as in fit. A rank
whose micro-batch is empty must still call the step (it is a collective); keep
Keras layers away from 0-sample batches there (Note [Empty micro-batches]).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.data import distributed_dataset, user_input
from tarantella.keras import gradient_reduction, sparse_gradients
from tarantella.keras.graph_allreduce import GraphAllreducer
from tarantella.sharding import update as sharding_update

__all__ = ["distribute_dataset", "reduce_gradients", "broadcast_variables"]

# One reducer per list of shapes and dtypes, created on first use (every rank traces the same steps in the
# same order, so they are created collectively) and kept for the life of the process.
_allreducers: list[GraphAllreducer] = []


def distribute_dataset(dataset: tf.data.Dataset, micro_batch_size: int | None = None) -> tf.data.Dataset:
    """This rank's part of `dataset`: elements (micro_batch, share), share = n_r / N a float32 scalar.

    `dataset` is batched with the GLOBAL batch size, or unbatched with `micro_batch_size` (samples per rank).
    All ranks must see the same global batches in the same order (seed any shuffle); to check it, call
    `tarantella.data.order_check.verify(stream)` on every rank after the first step and after each epoch (fit does).
    The output of tnt.distribute_datasets_from_function (file-level sharding) is accepted too."""
    size, rank = runtime.get_size(), runtime.get_rank()
    local = user_input.distribute(dataset, micro_batch_size=micro_batch_size, size=size, rank=rank)

    def with_share(element):
        batch = element[distributed_dataset.DATA]
        count = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        return batch, tf.cast(count, tf.float32) / tf.cast(element[distributed_dataset.GLOBAL_SIZE], tf.float32)

    return local.map(with_share)


@tf.autograph.experimental.do_not_convert  # plain Python at trace time (autograph mangles its loops' returns)
def reduce_gradients(gradients, variables=None, share=None, overlap: bool = True, optimizer=None) -> list[tf.Tensor]:
    """sum over ranks of share * gradients (share defaults to 1 / ranks: the mean), in `variables`' shapes.

    Call it inside a tf.function (the same calls, in the same order, on every rank). `variables` give each
    gradient its shape (sparse gradients become dense); without them the gradients' own static shapes must
    be complete. None gradients become zeros. Sparse gradients of per-sample lookups (embeddings) stay
    tf.IndexedSlices: every rank's slices, as serial Keras would see them (Note [Sparse gradients stay sparse]).
    `optimizer`: one sharded by tnt.shard_optimizer(optimizer, mode="gradients") (ZeRO stage 2), which
    these gradients are for: each is summed on its variable's owner only, and None on the other ranks
    (optimizer.apply takes them as they are; Note [Gradients summed on their owners])."""
    gradients = list(gradients)
    if variables is None:
        variables = [tf.convert_to_tensor(gradient) for gradient in gradients]
    size = runtime.get_size()
    if share is None:
        share = tf.constant(1.0 / size)
    if size == 1:
        return [_scaled_sparse(gradient, share) if sparse_gradients.is_per_sample(gradient)
                else dense * tf.cast(share, dense.dtype)
                for gradient, dense in zip(gradients, gradient_reduction.dense_gradients(gradients, list(variables)))]
    to_owners = None if optimizer is None else sharding_update.reduction_to_owners(optimizer, list(variables))
    return gradient_reduction.weighted_sum(gradients, list(variables), share, _allreducer_for, overlap, to_owners)


def _scaled_sparse(gradient: tf.IndexedSlices, share) -> tf.IndexedSlices:
    """One rank's per-sample slices as the N-rank gather gives them (Note [Sparse gradients stay sparse])."""
    return tf.IndexedSlices(gradient.values * tf.cast(share, gradient.values.dtype), gradient.indices,
                            gradient.dense_shape)


def _allreducer_for(tensors) -> GraphAllreducer:
    for allreducer in _allreducers:
        if allreducer.matches(tensors):
            return allreducer
    allreducer = GraphAllreducer([t.shape for t in tensors], [t.dtype for t in tensors])
    _allreducers.append(allreducer)
    return allreducer


def broadcast_variables(variables, root: int | None = None) -> None:
    """Give every rank root's values of `variables` (eagerly; a collective: call it on every rank)."""
    root = runtime.get_master_rank() if root is None else root
    for variable in variables:
        value = collectives.broadcast(np.array(variable.numpy(), copy=True), root=root)
        if runtime.get_rank() != root:
            variable.assign(value)
