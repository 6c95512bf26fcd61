"""Never run Keras layers on a 0-sample micro-batch.

Note [Empty micro-batches]
A partial last global batch smaller than the rank count leaves some ranks with
no samples. Keras layers are not made for that (oneDNN's MaxPoolingGrad aborts,
BatchNormalization's moving statistics become NaN), yet the rank must still take
part in the step's allreduces. So an empty micro-batch is replaced by ONE
placeholder sample (zeros; weight 0 where the data has sample weights), the step
runs as usual with this rank's share n_r / N = 0 (its gradients count as exact
zeros, gradient_reduction.weighted_sum), and afterwards the state the placeholder
touched is put back: the metric variables and, with per-rank batch statistics
(batch_norm="local"), the non-trainable weights (BatchNormalization's moving
statistics). With global statistics (the default) the placeholder counts for
nothing in them and the moving statistics move as on every rank; the seed
states advance as on every rank too (the placeholder draws), which keeps the
ranks' seeds equal (Note [Random values by sample, not by rank]). Optimizer state and
trainable variables change exactly as on the other ranks (from the global sum).
When tf.data knows the micro-batch size statically and it is positive, nothing
of this is built (plain Keras speed).
"""
from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["with_placeholder", "Restorer", "sample_like", "state_to_keep"]


def _sample_count(batch) -> tuple[tf.Tensor, int | None]:
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first)[0], first.shape[0]


def _placeholder(tensor: tf.Tensor) -> tf.Tensor:
    shape = tf.concat([[1], tf.shape(tensor)[1:]], axis=0)
    if tensor.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, tensor.dtype)


def sample_like(spec: tf.TensorSpec) -> tf.Tensor:
    """One placeholder sample (zeros, or empty strings) of a batch with this spec; unknown sizes become 1."""
    shape = [1] + [1 if size is None else size for size in spec.shape[1:]]
    return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)


def with_placeholder(batch, can_be_empty: bool = True):
    """(the batch to run, its real sample count, whether it may be empty). can_be_empty=False (a single
    rank: every batch it gets holds a sample) builds nothing, as a positive static size does."""
    count, static = _sample_count(batch)
    if not can_be_empty or (static is not None and static > 0):
        return batch, count, False

    def swap(tensor):
        if tensor is None:
            return None
        return tf.cond(count > 0, lambda: tensor, lambda: _placeholder(tensor))

    return tf.nest.map_structure(swap, batch), count, True


def state_to_keep(model: keras.Model, metric_variables: list, batch_norm: str) -> list:
    """What an empty micro-batch's placeholder must leave as it was (Note [Empty micro-batches])."""
    kept = list(model.non_trainable_weights) if batch_norm == "local" else []
    return kept + list(metric_variables)


class Restorer:
    """Remembers `variables` before a step; `restore_if_empty` puts them back when the micro-batch was empty."""

    def __init__(self, variables, may_be_empty: bool):
        unique, seen = [], set()
        for variable in variables if may_be_empty else []:
            if id(variable) not in seen:
                seen.add(id(variable))
                unique.append(variable)
        self._variables = unique
        self._saved = [tf.identity(variable) for variable in unique]

    def restore_if_empty(self, count) -> None:
        if not self._variables:
            return

        def restore():
            for variable, saved in zip(self._variables, self._saved):
                variable.assign(saved)
            return tf.constant(True)

        tf.cond(count > 0, lambda: tf.constant(True), restore)
