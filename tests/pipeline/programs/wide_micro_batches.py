"""Pipelined training at the benchmark's shape, under enable_op_determinism, on 2 stages: micro-batches of 16
rows with deferred weight gradients (the backward's input gradient as (kernel dz^T)^T from 8 rows on, Note
[The input gradient as kernel dz^T]) and Keras's Adam in one pass (Note [Keras's Adam in one pass]).

    wide_micro_batches.py

Prints "OK <check>" for:
- the step traces TntAdamUpdate, and a pipeline whose optimizer is an Adam subclass (which keeps Keras's own
  per-variable ops) ends with the same weights to the bit;
- a second identical run ends with the same weights to the bit;
- the weights equal serial Keras's within 1e-4 relative.
"""
import keras
import numpy as np
import tensorflow as tf

tf.config.experimental.enable_op_determinism()

import tarantella as tnt  # noqa: E402

WIDTH, OUTPUTS, BATCH, MICRO_BATCHES, STEPS = 64, 8, 128, 8, 3


class KerasOwnAdam(keras.optimizers.Adam):
    """Keras's Adam as it is: adam_in_one_pass takes no subclass, so its per-variable ops stay Keras's."""


def build() -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input((WIDTH,))
    h = inputs
    for i in range(4):
        h = keras.layers.Dense(WIDTH, activation="relu", name=f"dense{i}")(h)
    return keras.Model(inputs, keras.layers.Dense(OUTPUTS, name="out")(h))


rng = np.random.default_rng(5)
x = rng.standard_normal((BATCH * STEPS, WIDTH)).astype("float32")
y = rng.standard_normal((BATCH * STEPS, OUTPUTS)).astype("float32")


def train(model, optimizer) -> list:
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def pipelined(optimizer):
    model = tnt.Model(build(), parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_pipeline_stages=2,
                      num_micro_batches=MICRO_BATCHES, schedule="1f1b", defer_weight_gradients=True)
    return model, train(model, optimizer)


def traced_op_types(model) -> set:
    step = model._step_functions["train"]
    return {op.type for function in step._list_all_concrete_functions() for op in function.graph.get_operations()}


def bitwise(what, actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.tobytes() == e.tobytes(), f"{what}: weight {i} differs, largest gap {np.max(np.abs(a - e))}"


one_pass, weights = pipelined(keras.optimizers.Adam(1e-3))
assert "TntAdamUpdate" in traced_op_types(one_pass), "the pipelined step does not update in one pass"
keras_own, keras_weights = pipelined(KerasOwnAdam(1e-3))
assert "TntAdamUpdate" not in traced_op_types(keras_own)
bitwise("Adam in one pass against Keras's own update", weights, keras_weights)
print("OK Adam in one pass gives Keras's own update's weights to the bit", flush=True)

_, again = pipelined(keras.optimizers.Adam(1e-3))
bitwise("a second run", again, weights)
print("OK run to run the same bits", flush=True)

serial_weights = train(build(), keras.optimizers.Adam(1e-3))
for i, (a, e) in enumerate(zip(weights, serial_weights)):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6, err_msg=f"weight {i} against serial Keras")
print("OK 16-row micro-batches train as serial Keras", flush=True)
print("OK done", flush=True)
