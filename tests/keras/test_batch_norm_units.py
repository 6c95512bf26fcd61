"""global_batch_norm.global_moments on one process (the allreduce of one rank is the identity): the statistics
and their gradient are serial Keras's (tf.nn.moments), also where the one-pass E[x²] − E[x]² of Keras's
synchronized path loses its digits (Note [BatchNormalization over the global batch])."""
import numpy as np
import pytest
import tensorflow as tf

from tarantella.step import batch_position, global_batch_norm


# The world sizes the positions claim: 2 takes the gathered one-round-trip statistics (N x (2C + 1) values
# fit the limit), a huge one the two-pass allreduces; with the identity as allreduce the other ranks hold nothing.
GATHERED, TWO_PASS = 2, 10 ** 6


def one_rank_position(rows: int, samples: int | None = None, world_size: int = GATHERED):
    samples = rows if samples is None else samples
    return batch_position.BatchPosition(
        start=tf.constant(0, tf.int64), rows=tf.constant(rows, tf.int64), samples=tf.constant(samples, tf.int64),
        global_size=tf.constant(rows, tf.int64), static_rows=rows, world_size=world_size, batch_norm="global",
        statistics_allreduce=tf.identity)


@pytest.mark.parametrize("world_size", [GATHERED, TWO_PASS])
def test_statistics_keep_their_digits_at_a_large_mean(world_size):
    rng = np.random.default_rng(0)
    x = tf.constant(1e4 + rng.normal(size=(64, 3, 3, 5)), tf.float32)
    axes = [0, 1, 2]
    mean, variance = global_batch_norm.global_moments(x, None, axes, one_rank_position(64, world_size=world_size))
    exact = np.var(x.numpy().astype(np.float64), axis=tuple(axes))
    one_pass = np.mean(np.square(x.numpy()), axis=tuple(axes)) - np.square(np.mean(x.numpy(), axis=tuple(axes)))
    assert np.max(np.abs(variance.numpy() - exact)) < 1e-3
    assert np.max(np.abs(one_pass - exact)) > 1.0  # what the one-pass formula would have given
    serial_mean, serial_variance = tf.nn.moments(x, axes)
    np.testing.assert_allclose(mean.numpy(), serial_mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(variance.numpy(), serial_variance.numpy(), rtol=1e-3)


@pytest.mark.parametrize("masked,world_size", [(False, GATHERED), (False, TWO_PASS), (True, GATHERED)])
def test_gradient_is_serial_kerass(masked, world_size):
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(6, 4, 3)) + 2.0, tf.float32)
    mask = tf.constant(rng.random((6, 4)) > 0.3) if masked else None
    upstream_mean, upstream_variance = tf.constant(rng.normal(size=3), tf.float32), \
        tf.constant(rng.normal(size=3), tf.float32)

    def serial(x):
        if mask is None:
            return tf.nn.moments(x, [0, 1])
        weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
        count = tf.reduce_sum(weights, [0, 1]) + 1e-7
        mean = tf.reduce_sum(x * weights, [0, 1]) / count
        return mean, tf.reduce_sum(tf.square(x - tf.stop_gradient(mean)) * weights, [0, 1]) / count

    results = []
    position = one_rank_position(6, world_size=world_size)
    for moments in (serial, lambda x: global_batch_norm.global_moments(x, mask, [0, 1], position)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            mean, variance = moments(x)
            objective = tf.reduce_sum(mean * upstream_mean) + tf.reduce_sum(variance * upstream_variance)
        results.append((mean.numpy(), variance.numpy(), tape.gradient(objective, x).numpy()))
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_an_empty_micro_batch_counts_nothing():
    """A rank running only the placeholder of an empty micro-batch adds zero sums and a zero count."""
    sent = []

    def record(tensor):
        sent.append(tensor.numpy())
        return tensor + 1.0  # as if the other ranks held one sample of value 1 per channel (and count 1)

    position = one_rank_position(1, samples=0)
    position = batch_position.BatchPosition(**{**position.__dict__, "statistics_allreduce": record})
    mean, _ = global_batch_norm.global_moments(tf.fill([1, 3], 5.0), None, [0], position)
    assert np.all(sent[0] == 0.0)  # sums and count of the placeholder: nothing
    np.testing.assert_allclose(mean.numpy(), [1.0, 1.0, 1.0])
