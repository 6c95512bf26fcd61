"""BatchNormalization over the global batch: the statistics of all ranks' samples, as serial Keras computes them.

Note [BatchNormalization over the global batch]
In training, Keras's BatchNormalization normalises with the mean and variance of
the batch and moves its moving statistics towards them. Serial Keras sees the
global batch; a rank sees its micro-batch. So, while tarantella traces a
data-parallel step (tarantella/step/batch_position.py), every
BatchNormalization layer computes its moments over the global batch:
  1. each rank sums its samples (and counts them; a rank running only an empty
     micro-batch's placeholder counts 0), one allreduce gives the global sum
     and count, hence the mean;
  2. each rank sums its squared differences from that mean, a second allreduce
     gives the variance.
That is the two-pass formula serial Keras uses (tf.nn.moments: the mean, then
the mean of squared differences from it), chosen over the one-pass sum and sum
of squares (Keras's own `synchronized` path, E[x²] − E[x]²) because the latter
cancels catastrophically when the mean is large against the spread (float32,
mean 1e4 and variance 1: the one-pass variance is off by about 1e-7 * 1e8 = 10;
tests/keras/test_batch_norm_units.py measures both). Where every rank's
statistics together are small (N x (2C + 1) values within 16 Ki: ResNet-50's
widest layer, C = 2048, up to 3 ranks; C = 64 up to 127) both passes happen in
ONE allreduce: each rank sends its count, its sum and its squared differences
from its OWN mean into its row of an N x (2C + 1) block, every rank receives all
rows and combines them in the same order with Chan et al.'s parallel formula,
M2 = Σ M2_r + Σ n_r (mean_r − mean)², as accurate as the two passes (the
deviations are about local and global means, never E[x²]). Each blocking
allreduce is a point where the ranks wait for each other; one fewer per layer
is worth N times the values while they stay this small (results/batch_norm_cost).
The gradient flows through the statistics as in serial
Keras (whose variance treats the mean as a constant: the mean's gradient through
it is zero): for this rank's sample x_i,
  dL/dx_i = G_mean / n + G_var * 2 (x_i - mean) / n,
where G_mean and G_var are the gradients of all ranks' losses with respect to
the global mean and variance, summed in ONE allreduce of both (a custom
gradient; differentiating the forward allreduces would take more). So a layer
costs two small allreduces a step (three where the gathered block is too large),
in one order on every rank (in_graph_sum.py).
The moving statistics are then updated by Keras itself from the global
moments: equal on every rank, and equal to serial's.

In a pipeline the statistics are those of each micro-batch over the stage's
replicas (Note [A pipeline's micro-batches and the layers that look at the
batch] in tarantella/pipelining/compiled_step.py); in exact mode those of each
virtual micro-batch (Note [BatchNormalization in exact mode]).

`tnt.Model(model, batch_norm="local")` keeps each rank's micro-batch statistics
(Horovod's and the original Tarantella's behaviour); a layer with
`synchronized=True` uses the global batch in either mode. With a mask (Keras's
masked moments) the same holds with the mask's weights, and Keras's epsilon in
the divisions. A subclass that overrides `_moments` keeps its own.

Keras offers no public hook for a layer's batch statistics; `_moments` is the
method Keras itself routes them through (and its own `synchronized` path), so
it is the one private name tarantella replaces, at class level, once: outside
a tarantella step it calls Keras's own method unchanged. A Keras without it
makes tnt.Model fail at once with a clear error (install()).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tarantella import batch_norm_allreduces
from tarantella.step import batch_position

__all__ = ["install", "global_moments"]

_ORIGINAL_ATTRIBUTE = "_tarantella_keras_moments"


def install() -> None:
    """Route BatchNormalization's moments through _moments (idempotent)."""
    layer_class = keras.layers.BatchNormalization
    if hasattr(layer_class, _ORIGINAL_ATTRIBUTE):
        return
    original = getattr(layer_class, "_moments", None)
    if original is None:  # pragma: no cover - another Keras
        raise RuntimeError(f"tarantella: this Keras ({keras.__version__}) has no BatchNormalization._moments, "
                           f"through which tarantella computes global batch statistics; use Keras 3.15")
    setattr(layer_class, _ORIGINAL_ATTRIBUTE, original)

    def _moments(self, inputs, mask):
        position = batch_position.current()
        if position is None:
            return original(self, inputs, mask)
        axes = [axis for axis in range(inputs.shape.rank) if axis not in _channel_axes(self, inputs.shape.rank)]
        if position.piece_statistics is not None:  # Note [BatchNormalization in exact mode]
            mean, variance = original(self, inputs, mask)
            position.piece_statistics(self, inputs, mask, axes, mean, variance)
            return mean, variance
        if position.statistics_allreduce is None or \
                (position.batch_norm == batch_position.LOCAL_BATCH_NORM and not self.synchronized):
            return original(self, inputs, mask)
        return global_moments(inputs, mask, axes, position)

    layer_class._moments = _moments


def _channel_axes(layer, rank: int) -> set[int]:
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    return {axis % rank for axis in axes}


def global_moments(inputs: tf.Tensor, mask, axes: list[int], position: batch_position.BatchPosition):
    """(mean, variance) over `axes` of the global batch (Note [BatchNormalization over the global batch])."""
    allreduce = position.statistics_allreduce
    dtype = inputs.dtype
    present = tf.cast(position.samples > 0, dtype)  # an empty micro-batch's placeholder counts nothing
    weights = None
    if mask is not None:  # as Keras's masked moments: the mask's weights, epsilon in the divisions
        weights = tf.cast(tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), tf.bool), tf.shape(inputs)), dtype)

    channels = _static_channels(inputs, axes)
    gathered = (weights is None and channels is not None
                and batch_norm_allreduces.gathered(position.world_size, channels))

    @tf.custom_gradient
    def moments(x):
        kept = tf.shape(tf.reduce_sum(x, axis=axes, keepdims=True))
        local_sum = tf.reduce_sum(x if weights is None else x * weights, axis=axes) * present
        if weights is None:
            local_count = tf.reshape(tf.cast(tf.size(x) // tf.maximum(tf.size(local_sum), 1), dtype), [1])
        else:
            local_count = tf.reshape(tf.reduce_sum(weights, axis=axes), [-1])
        local_count = local_count * present
        size = tf.size(local_sum)
        if gathered:
            count, mean, variance = _gathered_moments(x, axes, kept, local_sum, local_count, present, channels,
                                                      position.world_size, position.rank, allreduce)
            centred = x - tf.reshape(mean, kept)
        else:
            count, mean, variance, centred = _two_pass_moments(x, axes, kept, local_sum, local_count, weights,
                                                               present, allreduce)

        def gradient(mean_gradient, variance_gradient):
            summed = allreduce(tf.concat([tf.reshape(mean_gradient, [-1]), tf.reshape(variance_gradient, [-1])],
                                         axis=0))
            per_mean = tf.reshape(summed[:size] / count, kept)
            per_variance = tf.reshape(summed[size:] / count, kept)
            x_gradient = per_mean + 2.0 * per_variance * centred
            return (x_gradient if weights is None else x_gradient * weights) * present

        return (mean, variance), gradient

    return moments(inputs)


def _static_channels(inputs: tf.Tensor, axes: list[int]) -> int | None:
    kept = [inputs.shape[axis] for axis in range(inputs.shape.rank) if axis not in axes]
    return None if any(size is None for size in kept) else int(np.prod(kept, dtype=np.int64))


def _two_pass_moments(x, axes, kept, local_sum, local_count, weights, present, allreduce):
    """(count, mean, variance, x - mean): the global sum and count in one allreduce, then the squared
    deviations from the global mean in a second (masked inputs weigh by the mask, epsilon in the count)."""
    size = tf.size(local_sum)
    sums = allreduce(tf.concat([tf.reshape(local_sum, [-1]), local_count], axis=0))
    count = sums[size:] if weights is None else sums[size:] + keras.backend.epsilon()
    mean = tf.reshape(sums[:size] / count, tf.shape(local_sum))
    centred = x - tf.reshape(mean, kept)
    squares = tf.square(centred) if weights is None else tf.square(centred) * weights
    variance = tf.reshape(allreduce(tf.reshape(tf.reduce_sum(squares, axis=axes) * present, [-1])) / count,
                          tf.shape(local_sum))
    return count, mean, variance, centred


def _gathered_moments(x, axes, kept, local_sum, local_count, present, channels: int, world_size: int, rank: int,
                      allreduce):
    """(count, mean, variance) of the global batch in ONE allreduce: each rank puts its (count, sum, sum of
    squared deviations about its own mean) in its row of an N x (2C + 1) block, the sum of the blocks gives
    every rank all rows, and every rank combines them in the same order (Chan et al.'s parallel variance:
    M2 = sum of the M2_r + sum of n_r (mean_r - mean)^2, as accurate as the two-pass formula)."""
    dtype = x.dtype
    shape = tf.shape(local_sum)
    own_mean = local_sum / tf.maximum(local_count, 1.0)
    deviations = tf.reduce_sum(tf.square(x - tf.reshape(own_mean, kept)), axis=axes) * present
    row = tf.concat([local_count, tf.reshape(local_sum, [-1]), tf.reshape(deviations, [-1])], axis=0)
    width = 2 * channels + 1
    block = tf.concat([tf.zeros([rank * width], dtype), row, tf.zeros([(world_size - rank - 1) * width], dtype)], 0)
    rows = tf.reshape(allreduce(block), [world_size, width])
    counts, sums, squares = rows[:, :1], rows[:, 1:channels + 1], rows[:, channels + 1:]
    count = tf.reduce_sum(counts, axis=0)
    mean = tf.reduce_sum(sums, axis=0) / count
    means = tf.math.divide_no_nan(sums, counts)
    spread = tf.reduce_sum(squares, axis=0) + tf.reduce_sum(counts * tf.square(means - mean), axis=0)
    return count, tf.reshape(mean, shape), tf.reshape(spread / count, shape)
