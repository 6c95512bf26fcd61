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

It fails as a measure when the model treats samples by position: random
layers (Dropout) draw one mask per position, so reversing the batch gives
samples other masks; the harness notices by the size of the difference and
says so (repro/tolerance.py, ORDER_SENSITIVE_FACTOR).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella.data import distributed_dataset

__all__ = ["MODES", "check_supported", "reverse_batch"]

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
