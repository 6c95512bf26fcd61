"""Updates applied layer by layer in a stage's last weight pass (Note [Updates in the weight pass]): the same
bits as one apply of Keras's optimizer, and only where nothing needs the stage's gradients together. One
process."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella.pipelining.updates_in_weight_pass import UpdatesInWeightPass, updates_in_weight_pass


def make_variables():
    rng = np.random.default_rng(0)
    shapes = {"k1": (8, 4), "b1": (4,), "k2": (4, 3), "b2": (3,)}
    return [keras.Variable(rng.standard_normal(shape).astype("float32"), name=name,
                           constraint=keras.constraints.MaxNorm(1.5) if name == "k2" else None)
            for name, shape in shapes.items()]


OPTIMIZERS = {
    "adamw, schedule, decay exclusions": lambda: _excluding_biases(keras.optimizers.AdamW(
        keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.5), weight_decay=0.1)),
    "sgd momentum, clipnorm": lambda: keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=0.5),
    "rmsprop, clipvalue": lambda: keras.optimizers.RMSprop(1e-2, clipvalue=0.2),
}


def _excluding_biases(optimizer):
    optimizer.exclude_from_weight_decay(var_names=["b1", "b2"])
    return optimizer


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_layer_by_layer_updates_equal_one_apply_bit_for_bit(name):
    whole, layered = make_variables(), make_variables()
    one, by_layer = OPTIMIZERS[name](), OPTIMIZERS[name]()
    one.build(whole)
    by_layer.build(layered)

    @tf.function
    def one_apply(grads):
        one.apply(grads, whole)

    @tf.function
    def layer_by_layer(grads):
        updates = UpdatesInWeightPass(by_layer)
        done = updates.update(grads[:2], layered[:2], after=[])     # the first layer, in the weight pass
        with tf.control_dependencies(done):
            done = updates.update(grads[2:3], layered[2:3], after=[])   # the second layer's kernel
        with tf.control_dependencies(done):
            updates.finish(grads, layered)                          # the rest: the second layer's bias

    rng = np.random.default_rng(1)
    for _ in range(4):
        grads = [tf.constant(rng.standard_normal(v.shape).astype("float32")) for v in whole]
        one_apply(grads)
        layer_by_layer(grads)
    assert int(by_layer.iterations.numpy()) == int(one.iterations.numpy()) == 4
    for a, b in zip(whole, layered):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{name}: {a.name}")


def test_every_variable_updated_in_the_pass_still_counts_one_iteration():
    variables = make_variables()
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(variables)

    @tf.function
    def step(grads):
        updates = UpdatesInWeightPass(optimizer)
        updates.update(grads, variables, after=[])
        updates.finish(grads, variables)

    step([tf.ones(v.shape) for v in variables])
    assert int(optimizer.iterations.numpy()) == 1


def test_updates_wait_for_the_whole_stage_where_anything_needs_it():
    assert updates_in_weight_pass(keras.optimizers.Adam(), num_replicas=1, decides_across_stages=False)
    assert not updates_in_weight_pass(keras.optimizers.Adam(), num_replicas=2, decides_across_stages=False)
    assert not updates_in_weight_pass(keras.optimizers.Adam(), num_replicas=1, decides_across_stages=True)
    for refused in (keras.optimizers.Adam(global_clipnorm=1.0), keras.optimizers.Adam(use_ema=True),
                    keras.optimizers.Adam(gradient_accumulation_steps=2),
                    keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())):
        assert not updates_in_weight_pass(refused, num_replicas=1, decides_across_stages=False), refused

    class OwnApply(keras.optimizers.SGD):
        def apply(self, grads, trainable_variables=None):
            return super().apply(grads, trainable_variables)

    assert not updates_in_weight_pass(OwnApply(), num_replicas=1, decides_across_stages=False)
