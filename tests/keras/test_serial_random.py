"""serial_random on one process: a rank's draw for rows [start, start + n) of a global batch equals serial's draw
for the whole batch at those rows, for every recognised op and dtype, and rows that do not start on a Philox group
(Note [Random values by sample, not by rank])."""
import logging
import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella.step import batch_position, serial_random

SEED = tf.constant([7, 11], tf.int32)
DRAWS = {
    "uniform float32": lambda s: tf.random.stateless_uniform(s, SEED),
    "uniform float64": lambda s: tf.random.stateless_uniform(s, SEED, dtype=tf.float64),
    "uniform float16": lambda s: tf.random.stateless_uniform(s, SEED, dtype=tf.float16),
    "uniform bfloat16": lambda s: tf.random.stateless_uniform(s, SEED, dtype=tf.bfloat16),
    "normal float32": lambda s: tf.random.stateless_normal(s, SEED),
    "normal float64": lambda s: tf.random.stateless_normal(s, SEED, dtype=tf.float64),
    "truncated normal float32": lambda s: tf.random.stateless_truncated_normal(s, SEED),
    "truncated normal float64": lambda s: tf.random.stateless_truncated_normal(s, SEED, dtype=tf.float64),
    "uniform int32": lambda s: tf.random.stateless_uniform(s, SEED, minval=0, maxval=100, dtype=tf.int32),
    "uniform int64": lambda s: tf.random.stateless_uniform(s, SEED, minval=0, maxval=100, dtype=tf.int64),
    "full-range int64": lambda s: tf.random.stateless_uniform(s, SEED, minval=None, maxval=None, dtype=tf.int64),
    "stateless dropout": lambda s: tf.nn.experimental.stateless_dropout(tf.ones(s), 0.5, seed=SEED),
    "keras.random.dropout": lambda s: keras.random.dropout(tf.ones(s), 0.5, seed=keras.random.SeedGenerator(3)),
}


def position(start: int, rows: int, global_size: int) -> batch_position.BatchPosition:
    return batch_position.BatchPosition(
        start=tf.constant(start, tf.int64), rows=tf.constant(rows, tf.int64), samples=tf.constant(rows, tf.int64),
        global_size=tf.constant(global_size, tf.int64), static_rows=rows, world_size=2, batch_norm="global",
        statistics_allreduce=None)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_a_ranks_rows_are_serials_rows(name):
    serial_random.install()
    draw, batch = DRAWS[name], 7
    for row_shape in ([3], [4], [5, 2], [1]):
        serial = draw([batch] + row_shape).numpy()
        for start, rows in ((0, 3), (3, 2), (5, 2), (1, 6), (6, 1)):
            with batch_position.tracing_step(position(start, rows, batch)):
                part = draw([rows] + row_shape).numpy()
            np.testing.assert_array_equal(part, serial[start:start + rows], err_msg=f"{row_shape} {start} {rows}")


def test_draws_without_the_batch_and_outside_a_step_are_left_alone():
    serial_random.install()
    with batch_position.tracing_step(position(3, 2, 7)):
        vector = tf.random.stateless_uniform([5], SEED).numpy()   # leading 5 is not the 2 rows: no batch in it
        scalar = tf.random.stateless_uniform([], SEED).numpy()
    np.testing.assert_array_equal(vector, tf.random.stateless_uniform([5], SEED).numpy())
    assert scalar == tf.random.stateless_uniform([], SEED).numpy()


def test_unrecognised_random_ops_are_named_once():
    # A handler of the test's own on the tarantella logger: its stderr handler keeps the stream it was made
    # with (an earlier test's capture) and does not propagate to pytest's.
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    serial_random.logger.addHandler(handler)
    try:
        graph = tf.Graph()
        with graph.as_default():
            tf.random.uniform([4, 2], name="my_layer/stateful_noise")
        serial_random.warn_unrecognised(graph)
        serial_random.warn_unrecognised(graph)
    finally:
        serial_random.logger.removeHandler(handler)
    lines = [message for message in messages if "my_layer/stateful_noise" in message]
    assert len(lines) == 1 and "(RandomUniform) draws per rank" in lines[0]


def test_rows_reversed_gives_a_reversed_batch_its_samples_values():
    """tnt-repro's calibration feeds batches in reverse: each sample must keep the values it gets in order."""
    serial_random.install()
    plain = tf.random.stateless_uniform([6, 3], SEED).numpy()
    other = tf.random.stateless_uniform([5, 3], SEED).numpy()
    with serial_random.rows_reversed(tf.constant(6)):
        reversed_rows = tf.random.stateless_uniform([6, 3], SEED).numpy()
        not_the_batch = tf.random.stateless_uniform([5, 3], SEED).numpy()
    np.testing.assert_array_equal(reversed_rows, plain[::-1])
    np.testing.assert_array_equal(not_the_batch, other)


def test_uninstall_gives_back_the_per_rank_draws_and_install_restores_serials():
    """The benchmark's tnt_rank_draws mode measures against the draws of before: serial's first rows."""
    draw = DRAWS["uniform float32"]
    serial = draw([6, 3]).numpy()
    try:
        serial_random.uninstall()
        with batch_position.tracing_step(position(4, 2, 6)):
            np.testing.assert_array_equal(draw([2, 3]).numpy(), serial[:2])
    finally:
        serial_random.install()
    with batch_position.tracing_step(position(4, 2, 6)):
        np.testing.assert_array_equal(draw([2, 3]).numpy(), serial[4:])
