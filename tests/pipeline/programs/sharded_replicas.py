"""shard="optimizer" with pipelining's data-parallel replicas (ParallelStrategy.ALL, issue 21): each stage's
optimizer state sharded over the stage's replicas, against the unsharded pipeline.

    tarantella -n 4 -- sharded_replicas.py      # 2 stages x 2 replicas

Under op determinism (what tnt-repro and the reproducibility guide set). For each optimizer set-up the same
seeded 2-stage model (Dense layers of uneven sizes, BatchNormalization before the cut, Dropout after it) is
trained pipelined unsharded and sharded. Checks: the weights are equal bit for bit, and every replica of a stage
holds the same; each rank keeps the optimizer state of its own share of its stage's variables, and the replicas'
shares make the stage; save writes the whole optimizer state, equal to the unsharded pipeline's;
tarantella.pipeline's load_model resumes sharded from either file as the unsharded pipeline does; stages 2 and 3
are refused in one line. Prints "OK <check>" ("OK <set-up>: bitwise unsharded").

Grappler's arithmetic optimizer is off, as in tests/keras/programs/sharded_optimizer.py (it rewrites a
learning-rate schedule's tensor by how many updates consume it).
"""
import os
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt
from tarantella.keras.layers import SplitLayer
from tarantella.pipeline import load_model
from tarantella.sharding import sharding_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "keras", "programs"))
from optimizer_set_ups import SET_UPS as COMMON_SET_UPS  # noqa: E402

tf.config.experimental.enable_op_determinism()
tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})

rank, size = tnt.get_rank(), tnt.get_size()
assert size == 4, "run on 4 ranks: 2 stages x 2 replicas"
rng = np.random.default_rng(0)
N, BATCH, MICRO_BATCHES = 64, 16, 2
x = rng.standard_normal((N, 10)).astype(np.float32)
y = rng.integers(0, 3, N).astype(np.int32)

SET_UPS = {
    **COMMON_SET_UPS,
    "LossScaleOptimizer(Adam, global_clipnorm)": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01, global_clipnorm=0.05), initial_scale=2.0 ** 20, dynamic_growth_steps=2),
}


def build():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((10,))
    h = keras.layers.Dense(33, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dense(9, activation="tanh")(h)
    h = SplitLayer()(h)
    h = keras.layers.Dropout(0.2)(h)
    h = keras.layers.Dense(17, activation="tanh")(h)
    h = keras.layers.Dense(5, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))


def pipelined(model, shard=None):
    return tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.ALL, num_micro_batches=MICRO_BATCHES,
                     shard=shard)


def compile_(model, make_optimizer):
    model.compile(optimizer=make_optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train(model, make_optimizer, epochs=2):
    compile_(model, make_optimizer)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


def assert_bitwise(expected, got, what):
    for index, (a, b) in enumerate(zip(expected, got)):
        assert np.array_equal(a, b), f"rank {rank} {what}: weight {index} differs by {np.max(np.abs(a - b)):.3g}"
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in got])
    gathered = tnt.allgather(flat)
    assert all(np.array_equal(gathered[0], other) for other in gathered[1:]), f"{what}: ranks hold different weights"


def slot_bytes(optimizer):
    return sum(int(np.prod(v.shape)) * 4 for v in optimizer.variables if len(v.shape) > 0)


for name, make_optimizer in SET_UPS.items():
    unsharded = train(pipelined(build()), make_optimizer)
    sharded = train(pipelined(build(), shard="optimizer"), make_optimizer)
    assert_bitwise(unsharded.get_weights(), sharded.get_weights(), f"{name}: sharded against unsharded")
    # The replicas of a stage hold the same weights of it (get_weights above reads them from one replica).
    held = tnt.allgather_object((sharded.placement.stage, [v.numpy() for v in sharded.stage_model.weights]))
    for stage, weights in held:
        if stage == sharded.placement.stage:
            assert_same = [np.array_equal(a, v.numpy()) for a, v in zip(weights, sharded.stage_model.weights)]
            assert all(assert_same), f"{name}: the replicas of stage {stage} hold different weights"
    update = sharding_of(sharded.optimizer)
    assert update is not None and update.size == 2, f"{name}: the stage's optimizer is not sharded over 2 replicas"
    owned_shapes = {tuple(v.shape) for v in update.owned}
    assert {tuple(v.shape) for v in sharded.optimizer.variables if len(v.shape) > 0} <= owned_shapes, \
        f"{name}: slots of variables this rank does not own"
    print(f"OK {name}: bitwise unsharded; slots {slot_bytes(sharded.optimizer)} of "
          f"{slot_bytes(unsharded.optimizer)} bytes", flush=True)

# The replicas' shares make the stage, each variable once, and every replica owns some.
owned = tnt.allgather_object((sharded.placement.stage, sorted(v.path for v in update.owned)))
mine = [paths for stage, paths in owned if stage == sharded.placement.stage]
assert all(mine), f"a replica owns nothing: {owned}"
assert sorted(p for paths in mine for p in paths) == sorted(v.path for v in sharded.stage_model.trainable_variables)
print("OK each rank keeps the optimizer state of its share of its stage", flush=True)

# Save gathers every share on the master: the file equals the unsharded pipeline's.
directory = tnt.broadcast_object(tempfile.mkdtemp() if rank == 0 else None)
make_optimizer = SET_UPS["AdamW excluding biases from decay"]
unsharded = train(pipelined(build()), make_optimizer)
sharded = train(pipelined(build(), shard="optimizer"), make_optimizer)
unsharded_path, sharded_path = os.path.join(directory, "unsharded.keras"), os.path.join(directory, "sharded.keras")
unsharded.save(unsharded_path)
sharded.save(sharded_path)
tnt.barrier()
expected = [v.numpy() for v in keras.saving.load_model(unsharded_path).optimizer.variables]
got = [v.numpy() for v in keras.saving.load_model(sharded_path).optimizer.variables]
assert len(expected) == len(got) and all(np.array_equal(a, b) for a, b in zip(expected, got)), \
    "the saved optimizer state differs from the unsharded pipeline's"
print("OK save writes the whole optimizer state, equal to the unsharded pipeline's", flush=True)


def resumed(path, shard=None):
    """Loaded and trained one epoch; a .keras file does not hold the Dropout layer's seed state, each load draws
    it, so every load draws it alike."""
    keras.utils.set_random_seed(3)
    model = load_model(path, data_parallel=True, num_micro_batches=MICRO_BATCHES, shard=shard)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


expected = resumed(unsharded_path)
assert_bitwise(expected, resumed(sharded_path, shard="optimizer"), "resuming sharded")
assert_bitwise(expected, resumed(unsharded_path, shard="optimizer"), "resuming the unsharded file sharded")
print("OK load_model resumes sharded from either file as the unsharded pipeline does", flush=True)

for mode in ("gradients", "weights"):
    try:
        pipelined(build(), shard=mode)
    except ValueError as error:
        assert "\n" not in str(error) and "ZeRO-1" in str(error), error
    else:
        raise AssertionError(f"shard={mode!r} with pipelining was accepted")
print("OK stages 2 and 3 are refused with pipelining in one line", flush=True)
print("OK done", flush=True)
