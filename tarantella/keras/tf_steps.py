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
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella.data import distributed_dataset

__all__ = ["unpack", "train_step", "test_step", "predict_step"]


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


def train_step(model, data):
    batch, global_size, _ = unpack(data, model.world_size)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    local_size = _batch_size(x)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        share = tf.cast(local_size, loss.dtype) / tf.cast(global_size, loss.dtype)  # Note [Loss of the global batch]
        scaled = model.optimizer.scale_loss(loss * share)
    variables = model.trainable_variables
    gradients = tape.gradient(scaled, variables)
    model.optimizer.apply(model.reduce_gradients(gradients, variables), variables)
    model.loss_tracker.update_state(loss, sample_weight=local_size)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def test_step(model, data):
    batch, _, _ = unpack(data, model.world_size)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = model(x, training=False)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    model.loss_tracker.update_state(loss, sample_weight=_batch_size(x))
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def predict_step(model, data):
    """The predictions, and (for tarantella's own input) each one's position in the input."""
    batch, _, first_index = unpack(data, model.world_size)
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = model(x, training=False)
    if not distributed_dataset.is_distributed_element(data):
        return y_pred
    positions = first_index + tf.range(tf.cast(_batch_size(x), tf.int64))
    return y_pred, positions


def dense_gradients(gradients, variables) -> list[tf.Tensor]:
    """Unconnected variables get zero gradients, sparse ones (embeddings) dense ones: every rank reduces the same."""
    return [tf.zeros_like(variable) if gradient is None else tf.convert_to_tensor(gradient)
            for gradient, variable in zip(gradients, variables)]
