"""Keras's Adam in one pass (tarantella/step/adam_in_one_pass.py): traced steps give Keras's own Adam's
variables and moments to the bit, and the op is used only where it is exact."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella.step.adam_in_one_pass import adam_in_one_pass, takes_adam_in_one_pass


def gradients_of(rng, shapes, step):
    """Gradients over many magnitudes, with zeros, signs and values near float32's ends."""
    out = []
    for shape in shapes:
        scale = 10.0 ** rng.integers(-30, 20, size=shape)
        g = rng.standard_normal(shape) * scale
        g.flat[::7] = 0.0
        g.flat[step % 5::11] = rng.choice([1e-38, -1e-39, 3e37, -2e30], size=g.flat[step % 5::11].shape)
        out.append(tf.constant(g.astype("float32")))
    return out


def train(optimizer, one_pass: bool, steps: int = 12):
    rng = np.random.default_rng(7)
    shapes = [(37, 29), (29,), (5, 3, 4)]
    variables = [keras.Variable(rng.standard_normal(s).astype("float32")) for s in shapes]
    optimizer.build(variables)
    all_gradients = [gradients_of(rng, shapes, step) for step in range(steps)]

    @tf.function
    def step(gradients):
        if one_pass:
            with adam_in_one_pass(optimizer):
                optimizer.apply(gradients, variables)
        else:
            optimizer.apply(gradients, variables)

    for gradients in all_gradients:
        step(gradients)
    return [v.numpy() for v in variables] + [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adam(1e-3),
    lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(3e-2, 3, 0.5), beta_1=0.8,
                                  beta_2=0.95, epsilon=1e-4, weight_decay=0.01, clipnorm=5.0),
])
def test_traced_steps_equal_keras_adam_to_the_bit(make):
    keras_state = train(make(), one_pass=False)
    one_pass_state = train(make(), one_pass=True)
    assert len(keras_state) == len(one_pass_state)
    for keras_array, one_pass_array in zip(keras_state, one_pass_state):
        np.testing.assert_array_equal(one_pass_array.view(np.uint32) if one_pass_array.dtype == np.float32
                                      else one_pass_array,
                                      keras_array.view(np.uint32) if keras_array.dtype == np.float32
                                      else keras_array)


def test_the_op_is_in_the_step_only_where_it_is_exact():
    variables = [keras.Variable(np.ones((4, 4), "float32"))]

    def traced_ops(optimizer):
        optimizer.build(variables)

        @tf.function
        def step():
            with adam_in_one_pass(optimizer):
                optimizer.apply([tf.ones((4, 4))], variables)

        return {op.type for op in step.get_concrete_function().graph.get_operations()}

    assert "TntAdamUpdate" in traced_ops(keras.optimizers.Adam())
    assert "TntAdamUpdate" not in traced_ops(keras.optimizers.Adam(amsgrad=True))
    assert "TntAdamUpdate" not in traced_ops(keras.optimizers.AdamW())
    assert not takes_adam_in_one_pass(keras.optimizers.SGD())
    optimizer = keras.optimizers.Adam()
    with adam_in_one_pass(optimizer):
        pass
    assert "update_step" not in vars(optimizer)   # Keras's own method again after the block
