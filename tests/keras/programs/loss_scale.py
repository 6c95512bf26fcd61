"""mixed_float16 with Keras's LossScaleOptimizer (dynamic loss scale) on N ranks against serial Keras
(issue 23 §3): the same scale, the same skipped steps, step for step, and weights within float16's rounding.

    tarantella -n N -- loss_scale.py

The initial scale (2^28) overflows float16's gradients: Keras halves it and skips the step until they are
finite, and grows it again after 3 good steps. One sample (row 30) is 300 times larger than the rest: at
scales that suit the others its scaled gradient overflows on the one rank that holds it, so the global
batch's gradient is not finite and every rank must skip, as serial Keras does (one decision for all ranks:
the sum of the ranks' gradients carries the inf). Also: the variables are float32 under the policy, and the
allreducer sums float32 (Note [16-bit gradients are summed in float32]). Prints "OK <check>".
"""
import keras
import numpy as np

import tarantella as tnt

keras.mixed_precision.set_global_policy("mixed_float16")
rank, size = tnt.get_rank(), tnt.get_size()
rng = np.random.default_rng(0)
N, BATCH = 96, 24
x = rng.standard_normal((N, 16)).astype(np.float32)
x[30] *= 300.0
y = rng.integers(0, 4, N).astype(np.int32)


def build():
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    return model


class Decisions(keras.callbacks.Callback):
    """After every step: the loss scale and how many updates the inner optimizer applied."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.steps.append((float(optimizer.dynamic_scale.numpy()), int(optimizer.inner_optimizer.iterations.numpy())))


def train(model):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0 ** 28,
                                                    dynamic_growth_steps=3)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    decisions = Decisions()
    model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[decisions])
    return decisions.steps, model.get_weights()


serial_steps, serial_weights = train(build())
steps, weights = train(tnt.Model(build()))
skipped = sum(1 for (_, a), (_, b) in zip([(0, 0)] + serial_steps, serial_steps) if a == b)
assert skipped >= 5, f"the test should skip steps: {serial_steps}"
assert steps == serial_steps, f"rank {rank}: decisions {steps} != serial's {serial_steps}"
print("OK the loss scale and the skipped steps are serial's, step for step", flush=True)

for index, (a, b) in enumerate(zip(weights, serial_weights)):
    scale = float(np.max(np.abs(b)))
    difference = float(np.max(np.abs(a - b))) / scale
    assert difference < 2.0 ** -8, f"weight {index}: {difference:.3g} relative to its largest, beyond float16 rounding"
gathered = tnt.allgather(np.concatenate([w.ravel() for w in weights]))
assert all(np.array_equal(gathered[0], other) for other in gathered[1:]), "ranks hold different weights"
print("OK weights within float16's rounding of serial's, the same on every rank", flush=True)

if size > 1:
    model = tnt.Model(build())
    train(model)
    allreducer = model._gradient_allreducer
    assert {str(d) for d in allreducer.dtypes} == {"<dtype: 'float32'>"}, allreducer.dtypes
print("OK the gradients are summed in float32", flush=True)
print("OK done", flush=True)
