"""A pipeline's layers that look at the batch, against serial Keras (issue 19 §1, §2; Note [A pipeline's
micro-batches and the layers that look at the batch] in tarantella/pipelining/compiled_step.py).

    check_batch_layers.py       on 2 x R ranks: 2 stages, R replicas (ParallelStrategy.ALL when R > 1)

- random layers (Dropout before the cut, GaussianNoise and RandomFlip after it), 4 micro-batches, both
  schedules: every micro-batch draws serial's values for its samples, so losses and weights
  equal serial Keras's (1e-5); with today's per-call draws every micro-batch would share serial's first rows;
- BatchNormalization on both stages with 1 micro-batch: the stage's replicas share their statistics, so a
  replica's micro-batch is normalised as the global batch: equal to serial Keras, moving statistics included;
- BatchNormalization with 4 micro-batches: the statistics of each micro-batch over the replicas (GPipe's
  semantics): every replica of a stage ends with the same moving statistics, which differ from serial's.
Prints "OK <check>".
"""
import keras
import numpy as np

import tarantella as tnt
from tarantella.keras.layers import SplitLayer

size = tnt.get_size()
REPLICAS = size // 2
RTOL, ATOL = 1e-5, 1e-6
rng = np.random.default_rng(4)
N, BATCH = 48, 16  # a replica's part of 16 / R samples, cut into 4 equal micro-batches (a pipeline's rule)
x = rng.standard_normal((N, 4, 4, 2)).astype("float32")
x[N // 2:] += 2.0  # the halves differ in mean: statistics of a part would show
y = rng.integers(0, 3, N).astype("int32")


def build(batch_norm: bool, random_layers: bool, split: bool) -> keras.Model:
    keras.utils.set_random_seed(7)
    L = keras.layers
    inputs = keras.Input((4, 4, 2))
    h = L.Conv2D(6, 3, padding="same", activation="relu")(inputs)
    if batch_norm:
        h = L.BatchNormalization()(h)
    if random_layers:
        h = L.Dropout(0.3, seed=11)(h)
    if split:
        h = SplitLayer()(h)
    if random_layers:
        h = L.RandomFlip("horizontal", seed=12)(h)
    h = L.Conv2D(6, 1, activation="tanh")(h)
    if batch_norm:
        h = L.BatchNormalization()(h)
    if random_layers:
        h = L.GaussianNoise(0.2, seed=13)(h)
    outputs = L.Dense(3)(L.GlobalAveragePooling2D()(h))
    return keras.Model(inputs, outputs)


def train(model):
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"], model.get_weights()


def close(what, actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what} [{i}]")


def pipelined(batch_norm: bool, random_layers: bool, micro_batches: int, schedule: str):
    strategy = tnt.ParallelStrategy.ALL if REPLICAS > 1 else tnt.ParallelStrategy.PIPELINING
    model = tnt.Model(build(batch_norm, random_layers, split=True), parallel_strategy=strategy,
                      num_micro_batches=micro_batches, schedule=schedule)
    assert model.placement.num_stages == 2 and model.placement.num_replicas == REPLICAS
    return model


serial_random = train(build(batch_norm=False, random_layers=True, split=False))
for schedule in ("1f1b", "gpipe"):
    model = pipelined(batch_norm=False, random_layers=True, micro_batches=4, schedule=schedule)
    losses, weights = train(model)
    close(f"{schedule}: losses with random layers", losses, serial_random[0])
    close(f"{schedule}: weights with random layers", weights, serial_random[1])
    print(f"OK {schedule}: random layers draw serial's values per micro-batch", flush=True)

serial_both = train(build(batch_norm=True, random_layers=True, split=False))
losses, weights = train(pipelined(batch_norm=True, random_layers=True, micro_batches=1, schedule="1f1b"))
close("one micro-batch: losses with BatchNormalization", losses, serial_both[0])
close("one micro-batch: weights and moving statistics", weights, serial_both[1])
print("OK one micro-batch: BatchNormalization over the replicas is serial's", flush=True)

model = pipelined(batch_norm=True, random_layers=False, micro_batches=4, schedule="1f1b")
_, weights = train(model)
moving = [v for v in model.stage_model.non_trainable_variables if "moving" in v.path]
assert len(moving) == 2, [v.path for v in moving]
stage_group = tnt.collectives.Group.world().split(model.placement.stage)
for variable in moving:  # the stage's replicas hold the same bits
    value = np.asarray(variable.numpy(), np.float64)
    total = tnt.collectives.allreduce(value, group=stage_group)
    np.testing.assert_array_equal(total, value * REPLICAS, err_msg=variable.path)
serial_bn = train(build(batch_norm=True, random_layers=False, split=False))
moving_serial = [w for w, v in zip(serial_bn[1], build(True, False, False).weights) if "moving" in v.path]
moving_pipelined = [w for w, v in zip(weights, build(True, False, False).weights) if "moving" in v.path]
assert max(float(np.max(np.abs(a - b))) for a, b in zip(moving_pipelined, moving_serial)) > 1e-4, \
    "per-micro-batch statistics should differ from serial's"
print("OK four micro-batches: the replicas share each micro-batch's statistics", flush=True)
print("OK done", flush=True)
