"""Keras's Adam, each variable's update in one pass over its arrays: the op TntAdamUpdate
(Note [Keras's Adam in one pass] in csrc/tf/adam_update_op.cc), to the bit Keras's own update.

Only while a step is traced, and only for what the op does exactly as Keras does: a `keras.optimizers.Adam`
itself (no subclass, which may change the update; no amsgrad) and a float32 variable with a dense float32
gradient. Everything else, and Keras's apply around the per-variable updates (clipping, weight decay,
constraints, the iteration count), stays Keras's.
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tarantella import tf_ops

__all__ = ["adam_in_one_pass", "takes_adam_in_one_pass"]


def takes_adam_in_one_pass(optimizer) -> bool:
    """Whether `optimizer`'s per-variable updates can go through TntAdamUpdate."""
    return type(optimizer) is keras.optimizers.Adam and not optimizer.amsgrad


@contextlib.contextmanager
def adam_in_one_pass(optimizer):
    """Within the block, `optimizer.apply` updates each float32 variable with TntAdamUpdate (where
    takes_adam_in_one_pass), else it is Keras's as usual."""
    if not takes_adam_in_one_pass(optimizer) or "update_step" in vars(optimizer):
        yield
        return
    op = tf_ops.load_ops().tnt_adam_update
    keras_update_step = optimizer.update_step

    def update_step(gradient, variable, learning_rate):
        if (isinstance(gradient, tf.IndexedSlices) or variable.dtype != tf.float32
                or gradient.dtype != tf.float32):
            return keras_update_step(gradient, variable, learning_rate)
        # Keras's scalars, by Keras's ops in Keras's order (Adam.update_step).
        lr = ops.cast(learning_rate, variable.dtype)
        local_step = ops.cast(optimizer.iterations + 1, variable.dtype)
        beta_1_power = ops.power(ops.cast(optimizer.beta_1, variable.dtype), local_step)
        beta_2_power = ops.power(ops.cast(optimizer.beta_2, variable.dtype), local_step)
        alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        index = optimizer._get_variable_index(variable)
        m = optimizer._momentums[index].value
        v = optimizer._velocities[index].value
        # Keras multiplies and adds these Python floats as float32 tensors: the same roundings.
        op(var=variable.handle, m=m.handle, v=v.handle, grad=gradient, alpha=alpha,
           one_minus_beta_1=np.float32(1 - optimizer.beta_1), one_minus_beta_2=np.float32(1 - optimizer.beta_2),
           epsilon=np.float32(optimizer.epsilon))

    optimizer.update_step = update_step
    try:
        yield
    finally:
        del optimizer.update_step
