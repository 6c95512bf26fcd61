"""Each rank holds only its stage, and the whole model's semantics hold across stages (2 ranks, 2 stages).

- per-rank weights held: at most 0.55 of the whole model; the stage optimizer's slots cover only
  the stage's variables;
- global_clipnorm (whole-model norm), a kernel regularizer and an activity loss on the first
  stage, and class_weight train like serial Keras (losses and weights within 1e-5);
- a LossScaleOptimizer whose first steps overflow skips the same steps as serial Keras;
- save after one epoch, load_model, one more epoch == two serial epochs (optimizer state resumed);
  the file is a plain Keras model with the optimizer's state;
- a micro-batch count that does not divide the batch is an error before training, on every rank.
Prints "OK <check>".
"""
import os
import sys

import keras
import numpy as np

import tarantella as tnt
from tarantella.keras.layers import SplitLayer
from tarantella import stage_state
from tarantella.pipeline import load_model, make_pipelined_model

RTOL, ATOL = 1e-5, 1e-6
rank = tnt.get_rank()
directory = sys.argv[1]
N, BATCH = 48, 16
rng = np.random.default_rng(3)
x = rng.standard_normal((N, 12)).astype("float32")
labels = rng.integers(0, 3, N)
y = np.eye(3, dtype="float32")[labels]


def build(regularized: bool = False) -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, activation="tanh", name="d0",
                           kernel_regularizer=keras.regularizers.L2(1e-2) if regularized else None)(inputs)
    if regularized:
        h = keras.layers.ActivityRegularization(l1=1e-3, name="activity")(h)
    h = keras.layers.Dense(32, activation="tanh", name="d1")(h)
    h = SplitLayer(name="cut")(h)
    h = keras.layers.Dense(40, activation="tanh", name="d2")(h)  # stages of about equal size
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="d3")(h))


def close(what, actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what} [{i}]")


class StepLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def train(model, optimizer, epochs=2, inputs=x, **fit):
    model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
    record = StepLosses()
    history = model.fit(inputs, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[record], **fit)
    return record.losses, history.history


# --- memory: the other stage's weights are released -----------------------------------------
whole = build()
total = stage_state.held_bytes(whole.weights)
model = make_pipelined_model(whole, num_micro_batches=4)
held = stage_state.held_bytes(whole.weights)
mine = stage_state.held_bytes(model.stage_model.weights)
print(f"rank {rank} holds {held} of {total} weight bytes ({held / total:.3f})", flush=True)
assert held == mine and held / total <= 0.55, (held, mine, total)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="categorical_crossentropy")
model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
slots = [v for v in model.optimizer.variables if v.name.endswith(("_momentum", "_velocity"))]
assert len(slots) == 2 * len(model.stage_model.trainable_variables), [v.name for v in slots]
assert stage_state.held_bytes(whole.weights) == mine
print("OK each rank holds only its stage's weights and optimizer state", flush=True)

# --- whole-model semantics ------------------------------------------------------------------
class_weight = {0: 1.0, 1: 2.5, 2: 0.5}
serial_model = build(True)
serial_losses, serial_history = train(serial_model, keras.optimizers.Adam(1e-2, global_clipnorm=0.05),
                                      class_weight=class_weight)
pipelined = make_pipelined_model(build(True), num_micro_batches=4)
losses, history = train(pipelined, keras.optimizers.Adam(1e-2, global_clipnorm=0.05), class_weight=class_weight)
close("step losses", losses, serial_losses)
close("weights", pipelined.get_weights(), serial_model.get_weights())
print("OK global_clipnorm, regularizers, add_loss and class_weight train like serial", flush=True)


def loss_scaled():
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0 ** 127)


serial_model = build()
# Large inputs: the first layer's scaled gradients overflow while the scale is high.
serial_losses, _ = train(serial_model, loss_scaled(), epochs=1, inputs=x * 1e3)
pipelined = make_pipelined_model(build(), num_micro_batches=4)
losses, _ = train(pipelined, loss_scaled(), epochs=1, inputs=x * 1e3)
applied = int(serial_model.optimizer.inner_optimizer.iterations.numpy())
assert applied < N // BATCH, f"no step was skipped ({applied} applied); the check is void"
close("loss-scaled losses", losses, serial_losses)
close("loss-scaled weights", pipelined.get_weights(), serial_model.get_weights())
print("OK a LossScaleOptimizer takes one decision for all stages", flush=True)

# --- save, load, resume ---------------------------------------------------------------------
serial_model = build()
train(serial_model, keras.optimizers.Adam(1e-2), epochs=2)
pipelined = make_pipelined_model(build(), num_micro_batches=4)
train(pipelined, keras.optimizers.Adam(1e-2), epochs=1)
path = os.path.join(directory, "resume.keras")
pipelined.save(path)
if rank == 0:
    plain = keras.saving.load_model(path)
    assert int(plain.optimizer.iterations.numpy()) == N // BATCH, plain.optimizer.iterations
    names = {v.name for v in plain.optimizer.variables}
    assert {"d0_kernel_momentum", "d3_kernel_velocity"} <= names, names
tnt.barrier()
resumed = load_model(path, num_micro_batches=4)
assert stage_state.held_bytes(resumed.whole_model.weights) / total <= 0.55
resumed.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
close("resumed weights", resumed.get_weights(), serial_model.get_weights())
print("OK save gathers the whole model and optimizer; load_model resumes training", flush=True)

# --- built without storage: each rank materialises only its stage ----------------------------
# Unseeded on purpose: Keras draws an unseeded initializer's seed from Python's random, here different on
# each rank; the master's seeds reach every rank (Note [Models built without storage]).
import random  # noqa: E402


def with_dropout() -> keras.Model:
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, activation="tanh", name="d0")(inputs)
    h = keras.layers.Dropout(0.2, seed=5, name="drop")(h)
    h = keras.layers.Dense(32, activation="tanh", name="d1")(h)
    h = SplitLayer(name="cut")(h)
    h = keras.layers.Dense(40, activation="tanh", name="d2")(h)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="d3")(h))


random.seed(1000 + rank)
with tnt.deferred_weights():
    deferred = with_dropout()
assert stage_state.held_bytes(deferred.weights) == 0, "a deferred model holds weights before the cut"
pipelined = make_pipelined_model(deferred, num_micro_batches=4)
held = stage_state.held_bytes(deferred.weights)
assert held == stage_state.held_bytes(pipelined.stage_model.weights) and 0 < held / total <= 0.55, (held, total)
initial = pipelined.get_weights()   # gathered from the stages
random.seed(1000)                   # the master's seeds, eagerly: the same initial weights
serial_model = with_dropout()
close("initial weights of a deferred build", initial, serial_model.get_weights())
serial_losses, _ = train(serial_model, keras.optimizers.Adam(1e-2), epochs=1)
losses, _ = train(pipelined, keras.optimizers.Adam(1e-2), epochs=1)
close("deferred build's losses", losses, serial_losses)
close("deferred build's weights", pipelined.get_weights(), serial_model.get_weights())
assert stage_state.held_bytes(deferred.weights) == held
print("OK a model built in deferred_weights() materialises only the rank's stage and trains like serial",
      flush=True)

# --- a micro-batch count that does not divide the batch -------------------------------------
try:
    resumed.fit(x, y, batch_size=10, epochs=1, verbose=0)
    raise AssertionError("no error for a batch of 10 in 4 micro-batches")
except ValueError as error:
    assert "does not split into 4 micro-batches" in str(error), error
print("OK micro-batches must divide the batch", flush=True)
print("OK done", flush=True)
