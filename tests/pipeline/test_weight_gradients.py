"""Deferred weight gradients on one process: a traced B pass gives the input gradients TensorFlow's own
gradient gives (in either form of Note [The input gradient as kernel dz^T]), and the W pass the weight
gradients, for every micro-batch size on either side of the form's threshold."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella.pipelining import weight_gradients
from tarantella.pipelining.weight_gradients import DeferredDense


def model_of(activation, use_bias):
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((24,)), keras.layers.Dense(32, activation=activation, use_bias=use_bias),
                             keras.layers.Dense(16, activation=activation, use_bias=use_bias)])


@pytest.mark.parametrize("activation,use_bias", [("relu", True), (None, False), ("tanh", True)])
def test_a_deferred_backward_and_weight_pass_give_tensorflows_gradients(activation, use_bias):
    model = model_of(activation, use_bias)
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    # Micro-batches on either side of the threshold below which TensorFlow's own form is kept.
    sizes = [weight_gradients._FEW_ROWS - 1, weight_gradients._FEW_ROWS, 2 * weight_gradients._FEW_ROWS]
    xs = [tf.constant(rng.standard_normal((n, 24)).astype("float32")) for n in sizes]
    dys = [tf.constant(rng.standard_normal((n, 16)).astype("float32")) for n in sizes]

    @tf.function
    def deferred():
        layers = DeferredDense(model, variables)
        input_grads = []
        for x, dy in zip(xs, dys):
            with tf.GradientTape() as tape:
                tape.watch(x)
                with layers.recording():
                    y = model(x)
            input_grads.append(tape.gradient(y, x, output_gradients=dy))
        gradients = [None] * len(variables)
        layers.weight_pass(gradients)
        return input_grads, gradients

    @tf.function
    def own():
        input_grads, gradients = [], [0.0] * len(variables)
        for x, dy in zip(xs, dys):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = model(x)
            grads = tape.gradient(y, [x] + variables, output_gradients=dy)
            input_grads.append(grads[0])
            gradients = [g + d for g, d in zip(gradients, grads[1:])]
        return input_grads, gradients

    (got_inputs, got_weights), (want_inputs, want_weights) = deferred(), own()
    for got, want in zip(got_inputs + got_weights, want_inputs + want_weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    # The first micro-batch is below the threshold: TensorFlow's own form, the same bits.
    np.testing.assert_array_equal(got_inputs[0].numpy(), want_inputs[0].numpy())
