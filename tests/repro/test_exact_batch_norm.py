"""Exact mode's BatchNormalization on one process (Note [BatchNormalization in exact mode]): the virtual
micro-batches normalise with their own statistics, and the moving statistics take one step towards the
global batch's moments, combined from the pieces' without losing digits at a large mean."""
import keras
import numpy as np
import tensorflow as tf

from tarantella._repro import exact_batch_norm
from tarantella.step import batch_position, global_batch_norm


def piece_position(rows: int, statistics):
    return batch_position.BatchPosition(
        start=tf.constant(0, tf.int64), rows=tf.constant(rows, tf.int64), samples=tf.constant(rows, tf.int64),
        global_size=tf.constant(rows, tf.int64), static_rows=rows, world_size=1, batch_norm="global",
        statistics_allreduce=None, piece_statistics=statistics)


def test_moving_statistics_take_one_step_to_the_global_batch():
    global_batch_norm.install()
    rng = np.random.default_rng(1)
    x = (1e3 + rng.normal(size=(16, 5)) * np.arange(1, 6)).astype(np.float32)
    x[8:] += 3.0  # the pieces differ in mean: the global variance is more than the pieces' mean variance
    layer = keras.layers.BatchNormalization(momentum=0.9)
    model = keras.Sequential([keras.Input((5,)), layer])
    statistics = exact_batch_norm.PieceStatistics(model)

    @tf.function
    def step(x):
        statistics.snapshot()
        outputs = []
        for index in range(4):
            with batch_position.tracing_step(piece_position(4, statistics)):
                outputs.append(model(x[4 * index:4 * (index + 1)], training=True))
        statistics.update_moving_statistics(None)
        return tf.concat(outputs, 0)

    outputs = step(tf.constant(x)).numpy()
    wide = x.astype(np.float64)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.1 * wide.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 + 0.1 * wide.var(axis=0), rtol=1e-4)
    # each piece normalised by its own statistics (ghost batches): zero mean per piece
    pieces = outputs.reshape(4, 4, 5)
    np.testing.assert_allclose(pieces.mean(axis=1), 0.0, atol=1e-3)
