"""serial_order on one process: with a global seed, the global batches of a shuffled fit come in serial
Keras's order (Note [Serial Keras's shuffle order]), partial last batch included, for shuffle=True and
shuffle="batch", with the cardinality Keras counts its steps by; without one, the master's seed decides."""
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella.data import serial_order

SAMPLES, BATCH, EPOCHS = 20, 8, 2


class RecordsBatches(keras.Model):
    def train_step(self, data):
        x, _ = data
        tf.print("batch", tf.cast(x[:, 0], tf.int32), summarize=-1, output_stream=sys.stdout)
        return {"loss": tf.constant(0.0)}


def keras_order(capfd, shuffle):
    keras.utils.set_random_seed(11)
    inputs = keras.Input((1,))
    model = RecordsBatches(inputs, keras.layers.Dense(1)(inputs))
    model.compile()
    capfd.readouterr()
    x = np.arange(SAMPLES, dtype="float32")[:, None]
    model.fit(x, x, batch_size=BATCH, epochs=EPOCHS, shuffle=shuffle, verbose=0)
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("batch")]
    return [[int(v) for v in line[len("batch ["):-1].split()] for line in lines]


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_shuffled_batches_come_in_serial_keras_order(capfd, shuffle):
    expected = keras_order(capfd, shuffle)
    keras.utils.set_random_seed(11)
    batches = serial_order.index_batches(SAMPLES, BATCH, shuffle, seed=0, keras_order=True)
    assert int(batches.cardinality()) == 3
    found = [batch.tolist() for _ in range(EPOCHS) for batch in batches.as_numpy_iterator()]
    assert found == expected and sorted(sum(found[:3], [])) == list(range(SAMPLES))


def test_without_keras_order_the_seed_decides_and_every_epoch_is_a_permutation():
    batches = serial_order.index_batches(SAMPLES, BATCH, True, seed=5, keras_order=False)
    again = serial_order.index_batches(SAMPLES, BATCH, True, seed=5, keras_order=False)
    first = [b.tolist() for b in batches.as_numpy_iterator()]
    assert first == [b.tolist() for b in again.as_numpy_iterator()]
    assert sorted(sum(first, [])) == list(range(SAMPLES)) and [len(b) for b in first] == [8, 8, 4]
    unshuffled = serial_order.index_batches(16, BATCH, False, seed=5, keras_order=True)
    assert unshuffled.element_spec.shape.as_list() == [BATCH]  # all full: a static batch size
    assert [b.tolist() for b in unshuffled.as_numpy_iterator()] == [list(range(8)), list(range(8, 16))]


def test_keras_order_needs_a_global_seed():
    tf.random.set_seed(None)
    assert serial_order.shared_shuffle()[1] is False
    keras.utils.set_random_seed(3)
    seed, follows_keras = serial_order.shared_shuffle()
    assert follows_keras and isinstance(seed, int)
