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

ZeRO stage 3 in a custom loop: each rank holds its own share of the weights (Note [Weights gathered layer by
layer] in tarantella/sharding/gathered_weights.py), the backward pass sums each gradient on its owner, and the
sharded optimizer updates the owned weights:

    weights = tnt.shard_weights(model)                       # a built model; every rank starts from the master's
    optimizer = tnt.shard_optimizer(keras.optimizers.Adam(), model.trainable_variables, mode="weights")
    @tf.function
    def step(batch, share):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tnt.gathered_gradients(tape, loss, model.trainable_variables, share=share)
        optimizer.apply(grads, model.trainable_variables)
    ...
    values = weights.whole_values()                          # a collective: every weight, on every rank
    with weights.whole_on(0):                                # a collective: rank 0 holds every weight inside
        if tnt.is_master_rank(): model.save("model.keras")
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella import runtime, stage_state
from tarantella.data import distributed_dataset, user_input
from tarantella.step import gradient_reduction, initial_weights, sparse_gradients
from tarantella.step.graph_allreduce import GraphAllreducer
from tarantella.sharding import gathered_weights, update as sharding_update, weight_shards

__all__ = ["distribute_dataset", "reduce_gradients", "broadcast_variables", "shard_weights", "gathered_gradients"]

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
    variables = list(variables)
    sharded = [v.path for v in variables if stage_state.is_released(v)]
    if sharded:
        raise ValueError(f"tarantella: {sharded[:3]} are held by their owners only (tnt.shard_weights); "
                         f"tnt.shard_weights starts every rank from the master's values itself, broadcast before it")
    initial_weights.broadcast_into(variables, root)


def shard_weights(model: keras.Model) -> gathered_weights.WeightGathering:
    """ZeRO stage 3 for a custom loop (a collective, on every rank alike): from now on each rank holds the weights
    it owns only (whole variables, balanced by bytes), every rank starting from the master's values (or, built in
    tnt.deferred_weights(), from serial Keras's initial values), and each layer gathers its weights from their
    owners when it runs (Note [Weights gathered layer by layer]). Train it with tnt.gathered_gradients and an
    optimizer sharded with tnt.shard_optimizer(optimizer, model.trainable_variables, mode="weights").
    Returns the model's WeightGathering: whole_values() (every weight on every rank, a collective) and
    whole_on(root) (a collective context in which `root` holds every weight, to save the model)."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"tarantella: shard_weights shards a keras.Model's weights, got {type(model).__name__}")
    already = gathered_weights.gathering_of(model.trainable_variables)
    if already is not None:
        return already
    return weight_shards.shard_weights(model, runtime.get_rank(), runtime.get_size())


@tf.autograph.experimental.do_not_convert
def gathered_gradients(tape, loss, variables, share=None) -> list:
    """ZeRO stage 3's reduce_gradients: for a model sharded by tnt.shard_weights, the gradients of share * loss
    summed over the ranks for the `variables` this rank owns (summed in the model's backward pass, on their
    owners), None for the others; the sharded optimizer's apply takes them as they are. Call it, on every rank
    alike, inside a tf.function after the tape's block; `share` as in reduce_gradients (default 1 / ranks: the
    mean). The share scales the loss's gradient before backprop (as tnt.Model's steps do), not the summed
    gradients: same values, rounded once more or less than reduce_gradients' share * sum."""
    variables = list(variables)
    gathering = gathered_weights.gathering_of(variables)
    if gathering is None:
        raise ValueError("tarantella: gathered_gradients gives the gradients of a model sharded by "
                         "tnt.shard_weights(model), and these variables are not; use tnt.reduce_gradients")
    if share is None:
        share = tf.constant(1.0 / runtime.get_size())
    loss = tf.convert_to_tensor(loss)
    return gathering.gradients(tape, loss, variables, output_gradients=tf.fill(tf.shape(loss),
                                                                                tf.cast(share, loss.dtype)))
