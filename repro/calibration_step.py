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
rows reversed too (tarantella/keras/serial_random.py, rows_reversed): each
sample keeps its values and the calibration stays a pure reassociation, as
the distributed run under serial semantics is. A model that still treats
samples by position (its own stateful random ops, a layer reading the row
index) makes the difference too large to be rounding; the harness notices and
says so (repro/tolerance.py, ORDER_SENSITIVE_LIMIT).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella.data import distributed_dataset

__all__ = ["MODES", "check_supported", "reverse_batch", "rows_of"]

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
