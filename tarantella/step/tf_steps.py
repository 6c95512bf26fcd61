"""The TensorFlow train/test/predict steps of a data-parallel tnt.Model.

Note [Loss of the global batch]
Keras's loss is the mean over the batch (plus regularisation). Rank r holds
n_r of the global batch's N samples, so it backpropagates its own loss times
n_r / N and the gradients are SUMMED over the ranks: the sum is exactly the
gradient of the global batch's loss (the regularisation term, weighted
n_r / N on every rank, adds up to one copy). A rank with no samples in a
partial last batch has weight 0 and still takes part in the allreduce. The
loss metric is updated with the unscaled local loss weighted by n_r, and
metric states are summed over ranks, so the logged loss is the global mean.
Losses with reduction "sum" or "mean_with_sample_weight" break the n_r / N
rule; tnt.Model expects the Keras default ("sum_over_batch_size").
A model with its own training logic is distributed through its optimizer
instead (Note [Distributing through the optimizer] in distributed_optimizer.py),
with the same arithmetic applied to the gradients.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella.data import distributed_dataset
from tarantella.step import batch_position, empty_micro_batch, metric_reduction, serial_random
from tarantella.step.gradient_reduction import dense_gradients  # noqa: F401  (exact mode imports it from here)
from tarantella.timeline import graph_marks

__all__ = ["check_loss_reduction", "unpack", "train_step", "test_step", "predict_step", "with_positions"]


def check_loss_reduction(loss) -> None:
    """Note [Loss of the global batch] needs losses that are means over the batch (compile's check)."""
    for item in tf.nest.flatten(loss):
        reduction = getattr(item, "reduction", None)
        if reduction in ("sum", "mean_with_sample_weight"):
            raise ValueError(f"tarantella: loss {getattr(item, 'name', item)!r} has reduction={reduction!r}; "
                             f"distributed training weights each rank's loss by its share of the global batch, "
                             f"which needs a mean over the batch: use reduction=\"sum_over_batch_size\"")


def unpack(data, size: int):
    """(batch, global batch size, position of the batch's first sample) from a step's input.
    Input not made by tarantella.data (train_on_batch & co.) counts as this
    rank's micro-batch of a global batch `size` times as large."""
    if distributed_dataset.is_distributed_element(data):
        return data[distributed_dataset.DATA], data[distributed_dataset.GLOBAL_SIZE], \
            data[distributed_dataset.FIRST_INDEX]
    local = _batch_size(keras.utils.unpack_x_y_sample_weight(data)[0])
    return data, tf.cast(local, tf.int64) * size, tf.constant(0, tf.int64)


def _batch_size(x):
    return tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]


def _state_to_keep(model) -> list:
    return empty_micro_batch.state_to_keep(model, metric_reduction.metric_variables(model.metrics), model.batch_norm)


def train_step(model, data):
    batch, global_size, _ = unpack(data, model.world_size)
    # Note [Empty micro-batches]; a single rank's batches are never empty (plain Keras's step)
    batch, local_size, may_be_empty = empty_micro_batch.with_placeholder(batch, model.world_size > 1)
    with batch_position.tracing_step(batch_position.of_step(model, batch, global_size, local_size)):
        logs = _train_step(model, batch, global_size, local_size, may_be_empty)
    serial_random.warn_unrecognised(tf.compat.v1.get_default_graph())
    return logs


def _train_step(model, batch, global_size, local_size, may_be_empty):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    restorer = empty_micro_batch.Restorer(_state_to_keep(model), may_be_empty)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        # Note [Loss of the global batch]; a single rank's share is exactly 1 (plain Keras's step)
        weighted = loss if model.world_size == 1 else \
            loss * (tf.cast(local_size, loss.dtype) / tf.cast(global_size, loss.dtype))
        scaled = graph_marks.mark(model.optimizer.scale_loss(weighted), graph_marks.LOSS)  # timeline only
    variables = model.trainable_variables
    gathering = getattr(model, "_gathering", None)   # shard="weights": the owned variables' only
    gradients = tape.gradient(scaled, variables) if gathering is None else gathering.gradients(tape, scaled, variables)
    # The metrics are updated before the update of the weights (they need y_pred only), so that
    # their state rides with the gradients (Note [Metric state rides with the gradients]).
    model.loss_tracker.update_state(loss, sample_weight=local_size)
    local_results = _update_metrics(model, x, y, y_pred, sample_weight, restorer, local_size)
    riding = metric_reduction.metric_state(model.metrics) if model.metrics_ride_with_gradients else []
    gradients, summed_state = model.reduce_gradients_and_metrics(gradients, variables, riding)
    model.optimizer.apply(gradients, variables)
    graph_marks.mark_after_updates(variables)  # timeline only
    if riding:
        return metric_reduction.results_from_state(model.metrics, summed_state)
    if model.world_size == 1:
        return local_results
    return model.get_metrics_result()  # the state summed over ranks, after the gradients


def test_step(model, data):
    batch, global_size, _ = unpack(data, model.world_size)
    batch, local_size, may_be_empty = empty_micro_batch.with_placeholder(batch, model.world_size > 1)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    restorer = empty_micro_batch.Restorer(_state_to_keep(model), may_be_empty)
    with batch_position.tracing_step(batch_position.of_step(model, batch, global_size, local_size)):
        y_pred = model(x, training=False)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    model.loss_tracker.update_state(loss, sample_weight=local_size)
    local_results = _update_metrics(model, x, y, y_pred, sample_weight, restorer, local_size)
    return local_results if model.world_size == 1 else model.get_metrics_result()  # the state summed over ranks


def _update_metrics(model, x, y, y_pred, sample_weight, restorer, local_size):
    """Update the metrics with this micro-batch and undo a placeholder's traces; this rank's results
    (the global ones on a single rank)."""
    with model.local_metric_results():
        results = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    restorer.restore_if_empty(local_size)
    return results


def predict_step(model, data):
    """The predictions, and (for tarantella's own input) each one's position in the input."""
    batch, global_size, first_index = unpack(data, model.world_size)
    batch, local_size, _ = empty_micro_batch.with_placeholder(batch, model.world_size > 1)
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    with batch_position.tracing_step(batch_position.of_step(model, batch, global_size, local_size)):
        y_pred = tf.nest.map_structure(lambda tensor: tensor[:local_size], model(x, training=False))
    return with_positions(data, y_pred, first_index, local_size)


def with_positions(data, y_pred, first_index, local_size):
    """For tarantella's own input, the predictions with their positions in the input (predict reorders by them)."""
    if not distributed_dataset.is_distributed_element(data):
        return y_pred
    return y_pred, first_index + tf.range(tf.cast(local_size, tf.int64))
