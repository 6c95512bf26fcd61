"""The TensorFlow train step of exact mode (Note [Exact mode] in tarantella/_repro/exact_reduction.py).

A drop-in for tarantella.step.tf_steps.train_step: this rank's micro-batch is
cut into the virtual micro-batches of its block (V/P of them when P is a power
of two; Note [Exact mode's blocks] in tarantella/data/exact_blocks.py), each
gets its own forward and backward pass, their gradients are added in the fixed pairwise tree, and the model's
allreduce (which must be recursive doubling) adds the ranks' subtrees.

Enable it with TNT_EXACT_VIRTUAL_BATCHES=V (V a power of two >= the largest rank
count to be compared; any count up to V) and
TNT_ALLREDUCE_ALGORITHM=recursive_doubling; `tnt-repro check --mode exact` sets both.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella import runtime
from tarantella._repro import exact_batch_norm, exact_reduction
from tarantella.data import distributed_dataset
from tarantella.data.exact_blocks import VIRTUAL_BATCHES_VARIABLE, virtual_batches_from_environment
from tarantella.step import batch_position, serial_random, tf_steps

__all__ = ["VIRTUAL_BATCHES_VARIABLE", "virtual_batches_from_environment", "prepare", "train_step"]


def prepare(virtual_batches: int, size: int, own_logic_of: str | None = None, weights_sharded: bool = False) -> None:
    """Check the set-up once, before tracing; user errors name the setting to change.
    own_logic_of: the class name of a model with its own training logic, else None; weights_sharded:
    shard="weights"."""
    if own_logic_of:
        raise ValueError(f"tarantella exact mode splits tnt.Model's own train step into virtual micro-batches, "
                         f"so {own_logic_of}'s own training logic cannot run in it; check this "
                         f"model in tolerance mode (`tnt-repro check --mode tolerance`)")
    if weights_sharded:
        raise ValueError("tarantella: tnt-repro's exact mode does not run shard='weights' (it reduces whole "
                         "gradients by virtual batches); check the script with shard='gradients'")
    exact_reduction.check_decomposition(virtual_batches, size)
    algorithm = runtime.settings().allreduce_algorithm
    if size > 1 and algorithm != "recursive_doubling":
        raise ValueError(f"tarantella exact mode needs TNT_ALLREDUCE_ALGORITHM=recursive_doubling (the only "
                         f"allreduce that adds the ranks' sums in a fixed binary tree), got {algorithm!r}; "
                         f"run with `tarantella --allreduce-algorithm recursive_doubling`")
    # Grappler's arithmetic optimizer may merge a tree of Adds into one AddN,
    # whose order is its own; the tree must stay as built.
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})


def _piece_position(model, global_size, index: int, piece, statistics) -> batch_position.BatchPosition:
    """Where virtual micro-batch `index` of this rank sits in the global batch. Random layers then draw each
    sample's serial values, the same for every split of the batch, so bitwise alike at every rank count;
    BatchNormalization normalises with the piece's statistics and hands them to `statistics`
    (Note [BatchNormalization in exact mode])."""
    global_size = tf.cast(global_size, tf.int64)
    start, _ = distributed_dataset.rank_start_count(global_size, model.world_size, runtime.get_rank())
    piece = tf.cast(piece, tf.int64)
    return batch_position.BatchPosition(start=start + index * piece, rows=piece, samples=piece,
                                        global_size=global_size, static_rows=None, world_size=model.world_size,
                                        batch_norm=model.batch_norm, statistics_allreduce=None,
                                        piece_statistics=statistics)


def train_step(model, data, virtual_batches: int):
    """One step of `model` (a tnt.Model) in exact mode; returns the metric results like Keras."""
    batch, global_size, _ = tf_steps.unpack(data, model.world_size)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    per_rank = len(exact_reduction.rank_blocks(virtual_batches, model.world_size)[runtime.get_rank()])
    local_size = tf.shape(tf.nest.flatten(x)[0])[0]
    tf.debugging.assert_equal(
        tf.math.floormod(global_size, virtual_batches), tf.constant(0, global_size.dtype),
        message=f"tarantella exact mode: every global batch must hold a multiple of {virtual_batches} samples "
                f"(the virtual micro-batches); choose such a batch size and dataset length, or drop the remainder")
    piece = local_size // per_rank
    variables = model.trainable_variables
    per_batch_gradients = []
    seeds = serial_random.StepSeedStates(model)
    statistics = exact_batch_norm.PieceStatistics(model)
    statistics.snapshot()
    for index in range(per_rank):
        seeds.restore()
        def part(tensor, index=index):
            return None if tensor is None else tensor[index * piece:(index + 1) * piece]
        x_i, y_i, w_i = (tf.nest.map_structure(part, value) if value is not None else None
                         for value in (x, y, sample_weight))
        with tf.GradientTape() as tape, batch_position.tracing_step(
                _piece_position(model, global_size, index, piece, statistics)):
            y_pred = model(x_i, training=True)
            loss = model.compute_loss(x=x_i, y=y_i, y_pred=y_pred, sample_weight=w_i, training=True)
            share = tf.cast(piece, loss.dtype) / tf.cast(global_size, loss.dtype)
            scaled = model.optimizer.scale_loss(loss * share)
        per_batch_gradients.append(tf_steps.dense_gradients(tape.gradient(scaled, variables), variables))
        model.loss_tracker.update_state(loss, sample_weight=piece)
        # Each piece only updates this rank's metric state: the metrics are reduced once per
        # step, after the last piece (one collective per step, as every rank makes it once).
        with model.local_metric_results():
            model.compute_metrics(x_i, y_i, y_pred, sample_weight=w_i)
    statistics.update_moving_statistics(model.statistics_allreduce if model.world_size > 1 else None)
    local_sum = exact_reduction.tree_sum_lists(per_batch_gradients)
    model.optimizer.apply(model.reduce_gradients(local_sum, variables), variables)
    return model.get_metrics_result()
