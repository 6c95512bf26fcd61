"""The calibration run: the serial run again, with every batch's samples in reverse order.

Note [Measured tolerance]
Reversing the samples of a batch changes nothing mathematically (the loss is a
mean over the batch, the gradient a sum over it) and changes only the order in
which the kernels add per-sample terms: the batch dimension of the matmuls'
backward pass, the loss mean, the reductions of the metrics. That is the same
kind of change as splitting the batch over ranks and summing the ranks'
gradients (a reassociation of the same sum), so the difference between the
serial run and its reversed twin, step by step and layer by layer, measures
how far this model and optimizer carry a reassociation of the batch sum
through training. repro/tolerance.py turns it into the tolerance of the
serial-vs-distributed comparison.

Random layers draw per position (one Dropout mask row per row of the batch):
fed a reversed batch, they would give every sample another sample's values.
So while the calibration step traces, every per-sample draw comes out with its
rows reversed too (tarantella/step/serial_random.py, rows_reversed): each
sample keeps its values and the calibration stays a pure reassociation, as
the distributed run under serial semantics is. A model that still treats
samples by position (its own stateful random ops, a layer reading the row
index) makes the difference too large to be rounding; the harness notices and
says so (repro/tolerance.py, Note [Derived tolerance]).

Note [Calibrating as the ranks round]
A reversal alone does not always reassociate what the ranks reassociate. Under a
mixed-precision policy a matmul's weight gradient sums the batch in float32
inside the kernel and is rounded to bfloat16 (float16) once: reversed, the
float32 sum rounds to the same bits, so the calibration measured 0 for every
kernel of the bfloat16 MLP of tests/repro while two ranks, each rounding its
half before the float32 allreduce adds them, moved the kernels by up to 4e-3
(Adam turns a rounding that flips a near-zero gradient's sign into a full
step). In float32 the reversal is a proxy too, and a loose one where one
reordering moves a training once and no further: the issue-44 ResNet pattern
(BatchNormalization over batch halves of other scales) jumped 2.8e-5 at step 1,
and 16 x that, the spread a proxy needs, was beyond float32's cap. So Keras's
own train step is calibrated as two ranks compute it, in every dtype: one
forward pass of the whole (reversed) batch, then one backward pass per half of
the batch's loss (each half's share of the mean, its own rounding in the
compute dtype), the halves' gradients added in float32 before the update. One
forward pass keeps random draws and BatchNormalization's statistics those of
the whole batch. The record notes the split, and the tolerance then takes a
spread of 4 over the envelope instead of 16: the split is the ranks' own
rounding, not a proxy for it (Note [Derived tolerance]); on the ResNet pattern
the envelope is 4.1e-5 after 4 steps, 2 and 4 devices differ by 2.9e-5 and
3.1e-5 (22 % and 19 % of the tolerance). A model with its own train_step is
reversed only (its step is its own), with the spread of 16, and so is a
tnt.Model's step (a script that wraps its model itself: its serial run feeds
tarantella's own input, whose step this split does not follow).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella._repro.protocol import CALIBRATION_SPLIT_NOTE as SPLIT_NOTE
from tarantella.data import distributed_dataset

__all__ = ["MODES", "SPLIT_NOTE", "check_supported", "reverse_batch", "rows_of", "split_train_step"]

MODES = ("reverse",)


def check_supported(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"tnt-repro: unknown calibration mode {mode!r}; expected one of {MODES}")


def _reverse(tensor):
    return None if tensor is None else tf.reverse(tensor, axis=[0])


def reverse_batch(data):
    """`data` of one step with the samples of its (micro-)batch in reverse order."""
    if distributed_dataset.is_distributed_element(data):
        reversed_data = dict(data)
        reversed_data[distributed_dataset.DATA] = tf.nest.map_structure(_reverse, data[distributed_dataset.DATA])
        return reversed_data
    return tf.nest.map_structure(_reverse, data)


def rows_of(data):
    """The number of samples of one step's (micro-)batch."""
    if distributed_dataset.is_distributed_element(data):
        data = data[distributed_dataset.DATA]
    return tf.shape(tf.nest.flatten(data)[0])[0]


def split_train_step(model, data, parts: int = 2):
    """Keras's train step with the batch's gradient summed from `parts` backward passes, one per part of the
    batch (Note [Calibrating as the ranks round]); the loss, its tracker and the metrics are the whole batch's."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    rows = rows_of(data)
    bounds = [(rows * part // parts, rows * (part + 1) // parts) for part in range(parts)]
    variables = model.trainable_weights
    with tf.GradientTape(persistent=True) as tape:
        y_pred = model(x, training=True)
        shares = []
        for start, stop in bounds:
            cut = lambda tree: None if tree is None else tf.nest.map_structure(  # noqa: E731
                lambda t: t[start:stop], tree)
            loss = model.compute_loss(x=cut(x), y=cut(y), y_pred=cut(y_pred), sample_weight=cut(sample_weight),
                                      training=True)
            shares.append(loss * tf.cast(stop - start, loss.dtype) / tf.cast(rows, loss.dtype))
        scaled = [model.optimizer.scale_loss(share) for share in shares]
    summed = None
    for part in scaled:
        gradients = [None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(part, variables)]
        summed = gradients if summed is None else [a if b is None else b if a is None else a + b
                                                   for a, b in zip(summed, gradients)]
    del tape
    model.optimizer.apply_gradients(zip(summed, variables))
    _loss_metric(model).update_state(tf.add_n(shares), sample_weight=rows)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _loss_metric(model):
    return next(m for m in model.metrics if m.name == "loss" and isinstance(m, keras.metrics.Mean))
