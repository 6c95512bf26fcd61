"""One-process checks of the pieces behind own training logic and Keras fidelity (no launcher)."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tarantella.keras import class_weights, user_steps

from tarantella.step import empty_micro_batch, gradient_reduction  # noqa: E402


class OwnStep(keras.Model):
    def train_step(self, data):
        return {}


class OwnLoss(keras.Sequential):
    def compute_loss(self, *args, **kwargs):
        return super().compute_loss(*args, **kwargs)


def test_overrides_are_detected_on_the_class():
    assert user_steps.overridden(OwnStep()) == ["train_step"]
    assert user_steps.overridden(OwnLoss()) == ["compute_loss"]
    assert user_steps.overridden(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])) == []


def test_sparse_gradients_get_their_variables_shape():
    table = tf.Variable(tf.zeros((50, 4)))

    @tf.function
    def gradient(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids))
        sparse = tape.gradient(loss, table)
        assert isinstance(sparse, tf.IndexedSlices)
        dense = gradient_reduction.dense_gradients([sparse, None], [table, table])
        assert all(g.shape == (50, 4) for g in dense)  # static, as the allreducer needs
        return dense

    summed, zeros = gradient(tf.constant([3, 3, 7]))
    assert summed.numpy()[3].tolist() == [2.0] * 4 and summed.numpy()[7].tolist() == [1.0] * 4
    assert not np.any(zeros.numpy())


def test_class_weights_follow_keras_rules():
    weights = {0: 2.0, 2: 0.5}
    assert class_weights.array_sample_weights(np.array([0, 1, 2]), None, weights).tolist() == [2.0, 1.0, 0.5]
    assert class_weights.array_sample_weights(np.array([[0.2], [1.6]]), None, weights).tolist() == [2.0, 0.5]
    one_hot = np.eye(3)[[2, 0]]
    assert class_weights.array_sample_weights(one_hot, None, weights).tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="not both"):
        class_weights.array_sample_weights(np.array([0]), np.array([1.0]), weights)
    with pytest.raises(ValueError, match="single output"):
        class_weights.array_sample_weights((np.array([0]), np.array([0])), None, weights)
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((3, 2)), np.array([0.0, 1.0, 2.2]))).batch(3)
    _, _, sample_weights = next(iter(class_weights.with_class_weights(dataset, weights)))
    assert sample_weights.numpy().tolist() == [2.0, 1.0, 0.5]
    with pytest.raises(ValueError, match="single output"):
        class_weights.with_class_weights(tf.data.Dataset.from_tensor_slices((np.zeros(2), (np.zeros(2),) * 2)),
                                         weights)


def test_an_empty_micro_batch_runs_one_placeholder_and_puts_state_back():
    state = tf.Variable(5.0)

    @tf.function
    def step(x, y):
        batch, count, may_be_empty = empty_micro_batch.with_placeholder((x, y))
        restorer = empty_micro_batch.Restorer([state], may_be_empty)
        state.assign_add(tf.cast(tf.shape(batch[0])[0], tf.float32))
        restorer.restore_if_empty(count)
        return tf.shape(batch[0])[0], count

    spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.int64))
    step = step.get_concrete_function(*spec)
    rows, count = step(tf.zeros((0, 3)), tf.zeros((0,), tf.int64))
    assert (int(rows), int(count), float(state.numpy())) == (1, 0, 5.0)
    rows, count = step(tf.zeros((2, 3)), tf.zeros((2,), tf.int64))
    assert (int(rows), int(count), float(state.numpy())) == (2, 2, 7.0)
