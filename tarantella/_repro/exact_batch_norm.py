"""BatchNormalization in exact mode: each virtual micro-batch normalises with its own statistics, the moving
statistics follow the global batch's, combined in the fixed tree.

Note [BatchNormalization in exact mode]
Exact mode runs every virtual micro-batch (B/V samples, Note [Exact mode]) as a
forward and backward pass of its own, one after another, so that every op sees
the same shapes at every rank count. The global batch's statistics of a layer
need every micro-batch's input to that layer before any of them may go on,
which a sequence of whole passes cannot give. So in exact mode:
  - a BatchNormalization layer normalises each virtual micro-batch with that
    micro-batch's own mean and variance ("ghost batch" normalisation, Hoffer et
    al. 2017), and its gradient flows through them as in Keras: these are the
    same bits at every rank count, since V is fixed;
  - its moving mean and variance take ONE step per global batch, as serial
    Keras's do, towards the global batch's mean and variance, combined from the
    micro-batches' (count c_v, mean m_v, variance s_v) by the fixed pairwise tree
    of Note [Exact mode] (this rank's block, then the recursive-doubling sum over
    the ranks): mean = T(c_v m_v) / T(c_v), then, Chan et al.'s parallel formula,
    variance = T(c_v s_v + c_v (m_v - mean)^2) / T(c_v). Every layer's sums
    travel in one allreduce per pass (two a step in all), so the moving
    statistics are the same on every rank and have the same bits at every rank
    count.
So exact mode gives bitwise identical weights and moving statistics at 1, 2, 4,
... ranks for models with BatchNormalization; what it runs is ghost-batch
normalisation over B/V samples, which is not production's (the global batch's
statistics, Note [BatchNormalization over the global batch]): tnt-repro's
tolerance mode compares production runs, exact mode compares exact runs with
each other. A layer with `renorm=True` keeps Keras's own update per micro-batch
(its moving statistics then take V/P steps per rank and differ across ranks).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tarantella._repro import exact_reduction

__all__ = ["PieceStatistics"]


class PieceStatistics:
    """Traced within one exact step: `snapshot` before the first micro-batch, the layers' moments recorded
    by the `_moments` hook (global_batch_norm.py) as each micro-batch runs, `update_moving_statistics` after
    the last."""

    def __init__(self, model):
        self._layers = [layer for layer in model._flatten_layers(include_self=False)
                        if isinstance(layer, keras.layers.BatchNormalization) and not layer.renorm]
        self._moments: dict[int, list] = {}
        self._before: dict[int, tuple] = {}

    def snapshot(self) -> None:
        """The moving statistics before this step (the micro-batches' own updates overwrite them)."""
        self._before = {id(layer): (tf.identity(layer.moving_mean.value), tf.identity(layer.moving_variance.value))
                        for layer in self._layers if layer.moving_mean is not None}

    def __call__(self, layer, inputs, mask, axes, mean, variance) -> None:
        """Record one micro-batch's moments of `layer` (what Keras's own `_moments` gave)."""
        if id(layer) not in self._before:
            return
        if mask is None:
            count = tf.cast(tf.size(inputs) // tf.maximum(tf.size(mean), 1), mean.dtype) * tf.ones_like(mean)
        else:
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), mean.dtype), tf.shape(inputs))
            count = tf.reshape(tf.reduce_sum(weights, axis=axes), tf.shape(mean))
        self._moments.setdefault(id(layer), []).append((count, mean, variance))

    def update_moving_statistics(self, allreduce) -> None:
        """One moving-average step of every recorded layer towards the global batch's moments;
        `allreduce` sums a flat tensor over the ranks (None on one rank)."""
        recorded = [layer for layer in self._layers if id(layer) in self._moments]
        if not recorded:
            return
        total = lambda flat: flat if allreduce is None else allreduce(flat)  # noqa: E731
        firsts = []
        for layer in recorded:
            pieces = self._moments[id(layer)]
            firsts += [exact_reduction.tree_sum([tf.reshape(c * m, [-1]) for c, m, _ in pieces]),
                       exact_reduction.tree_sum([tf.reshape(c, [-1]) for c, _, _ in pieces])]
        sums = _split(total(tf.concat(firsts, 0)), firsts)
        means, counts, seconds = {}, {}, []
        for index, layer in enumerate(recorded):
            pieces = self._moments[id(layer)]
            counts[id(layer)] = sums[2 * index + 1]
            means[id(layer)] = sums[2 * index] / counts[id(layer)]
            mean = tf.reshape(means[id(layer)], tf.shape(pieces[0][1]))
            seconds.append(exact_reduction.tree_sum(
                [tf.reshape(c * v + c * tf.square(m - mean), [-1]) for c, m, v in pieces]))
        squares = _split(total(tf.concat(seconds, 0)), seconds)
        for index, layer in enumerate(recorded):
            shape = tf.shape(self._moments[id(layer)][0][1])
            mean = tf.reshape(means[id(layer)], shape)
            variance = tf.reshape(squares[index] / counts[id(layer)], shape)
            moving_mean, moving_variance = (tf.cast(v, mean.dtype) for v in self._before[id(layer)])
            # Keras's own update (BatchNormalization.call), once per global batch
            layer.moving_mean.assign(moving_mean * layer.momentum + mean * (1.0 - layer.momentum))
            layer.moving_variance.assign(moving_variance * layer.momentum + variance * (1.0 - layer.momentum))


def _split(flat, like: list) -> list:
    return tf.split(flat, tf.stack([tf.shape(t)[0] for t in like]))
