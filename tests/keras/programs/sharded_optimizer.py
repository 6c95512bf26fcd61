"""shard="optimizer" and "gradients" (ZeRO stages 1 and 2, issue 21) against unsharded data parallelism and
serial Keras.

    tarantella -n N -- sharded_optimizer.py

For each optimizer set-up the same seeded model (Dense, BatchNormalization, Dropout, Dense: variables of
uneven sizes, so some ranks own more than others) is trained three ways: serial Keras on this rank,
tnt.Model unsharded and tnt.Model(shard=mode) for each mode. Checks: the sharded weights equal the unsharded ones
bit for bit and serial's within 1e-6 (float32 set-ups), the same on every rank; the optimizer state
per rank is only the owned variables'; model.save writes the whole optimizer state, equal to the unsharded
model's; tnt.models.load_model(shard=...) resumes from it as the unsharded model does; models with their own
train_step (trained, saved, resumed), custom loops, mixed precision. Prints "OK <check>" ("OK <set-up>: bitwise
unsharded (<mode>)"). Rank 0 alone builds a serial model to save (as a user's script may): the models' automatic
names then differ between the ranks, which saving and loading must not mind.

Grappler's arithmetic optimizer is off: it rewrites a learning-rate schedule's tensor differently depending
on how many variables' updates consume it (unsharded: all of them; sharded: this rank's), which moves
RMSprop-with-a-schedule's weights by an ulp either way (and serial's too). With it off, the comparison is of
what sharding computes.
"""
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt
from optimizer_set_ups import SET_UPS as COMMON_SET_UPS
from own_train_step import OwnStep

tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})

rank, size = tnt.get_rank(), tnt.get_size()
MODES = ("optimizer", "gradients")
rng = np.random.default_rng(0)
N, BATCH = 96, 24
x = rng.standard_normal((N, 10)).astype(np.float32)
y = rng.integers(0, 3, N).astype(np.int32)


def build():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(33, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dropout(0.2),
                             keras.layers.Dense(17, activation="tanh"), keras.layers.Dense(3)])


SET_UPS = {
    **COMMON_SET_UPS,
    "SGD accumulating 2 steps, clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.1,
                                                                      gradient_accumulation_steps=2),
    "LossScaleOptimizer(Adam, global_clipnorm)": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01, global_clipnorm=0.05), initial_scale=2.0 ** 20, dynamic_growth_steps=2),
}


def train(model, make_optimizer, epochs=2, inputs=None):
    model.compile(optimizer=make_optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x if inputs is None else inputs, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


def owned_variables(model):
    """The variables whose optimizer state this rank keeps (all of them on one rank: nothing to shard)."""
    update = model._sharded_update
    return update.owned if update is not None else model.trainable_variables


def flat(arrays):
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def same_on_every_rank(arrays) -> bool:
    gathered = tnt.allgather(flat(arrays))
    return all(np.array_equal(gathered[0], other) for other in gathered[1:])


def assert_bitwise(expected, got, what):
    for index, (a, b) in enumerate(zip(expected, got)):
        assert np.array_equal(a, b), f"rank {rank} {what}: weight {index} differs by {np.max(np.abs(a - b)):.3g}"
    assert same_on_every_rank(got), f"{what}: ranks hold different weights"


for name, make_optimizer in SET_UPS.items():
    serial = train(build(), make_optimizer).get_weights()
    expected = train(tnt.Model(build()), make_optimizer).get_weights()
    for mode in MODES:
        sharded = train(tnt.Model(build(), shard=mode), make_optimizer)
        got = sharded.get_weights()
        assert_bitwise(expected, got, f"{name} sharded {mode!r} against unsharded")
        difference = max(float(np.max(np.abs(a - b))) for a, b in zip(serial, got))
        assert difference < 1e-6, f"rank {rank} {name} ({mode}): {difference:.3g} from serial"
        owned = owned_variables(sharded)
        assert len(owned) < len(sharded.trainable_variables) or size == 1
        slots = [v for v in sharded.optimizer.variables if len(v.shape) > 0]
        owned_shapes = sorted(tuple(v.shape) for v in owned)
        assert {tuple(v.shape) for v in slots} <= set(owned_shapes), f"{name}: slots of variables not owned: {slots}"
        print(f"OK {name}: bitwise unsharded ({mode}), serial within {difference:.1g}, the same on every rank",
              flush=True)

# Every rank owns a share of the whole: together the owned variables are the model's, each once.
owned = tnt.allgather_object(sorted(v.path for v in owned_variables(sharded)))
together = sorted(path for part in owned for path in part)
assert together == sorted(v.path for v in sharded.trainable_variables), owned
assert all(part for part in owned), f"a rank owns nothing: {owned}"
print("OK the optimizer state of each rank is its owned variables'", flush=True)

# Saving gathers the whole optimizer state on the master; loading scatters it back.
directory = tnt.broadcast_object(tempfile.mkdtemp() if rank == 0 else None)
make_optimizer = SET_UPS["AdamW excluding biases from decay"]
unsharded = train(tnt.Model(build()), make_optimizer)
sharded = train(tnt.Model(build(), shard="optimizer"), make_optimizer)
unsharded_path, sharded_path = os.path.join(directory, "unsharded.keras"), os.path.join(directory, "sharded.keras")
unsharded.save(unsharded_path)
sharded.save(sharded_path)
tnt.barrier()
plain_unsharded = keras.saving.load_model(unsharded_path)
plain_sharded = keras.saving.load_model(sharded_path)
expected = [v.numpy() for v in plain_unsharded.optimizer.variables]
got = [v.numpy() for v in plain_sharded.optimizer.variables]
assert len(expected) == len(got) and all(np.array_equal(a, b) for a, b in zip(expected, got)), \
    "the saved optimizer state differs from the unsharded model's"
print("OK save writes the whole optimizer state, equal to unsharded training's", flush=True)

def resumed_alike(unsharded_from, sharded_from, what):
    """The model loaded from `sharded_from` with shard="gradients" and trained one epoch, after checking that it
    trains bitwise as the unsharded model loaded from `unsharded_from`. A .keras file does not hold the Dropout
    layer's seed state: each load draws it, so both draw it alike."""
    keras.utils.set_random_seed(3)
    unsharded = tnt.models.load_model(unsharded_from)
    keras.utils.set_random_seed(3)
    sharded = tnt.models.load_model(sharded_from, shard="gradients")
    for model in (unsharded, sharded):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_bitwise(unsharded.get_weights(), sharded.get_weights(), what)
    return sharded


resumed_sharded = resumed_alike(unsharded_path, sharded_path, "resuming sharded against unsharded")
print("OK a saved sharded model resumes as the unsharded one does", flush=True)
# A checkpoint of another rank count: plain Keras's file of serial training (one rank) loads sharded on N ranks.
serial_path = os.path.join(directory, "serial.keras")
if rank == 0:
    train(build(), make_optimizer).save(serial_path)
tnt.barrier()
resumed_alike(serial_path, serial_path, "a serial checkpoint resumed sharded")
print("OK a checkpoint of one rank resumes sharded on N as unsharded", flush=True)
# ModelCheckpoint joins every rank in the save; its file holds the whole optimizer state.
checkpoint_path = os.path.join(directory, "checkpoint.keras")
resumed_sharded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                    callbacks=[keras.callbacks.ModelCheckpoint(checkpoint_path)])
resumed_sharded.save(sharded_path)
tnt.barrier()
from_checkpoint = keras.saving.load_model(checkpoint_path).optimizer.variables
from_save = keras.saving.load_model(sharded_path).optimizer.variables
assert len(from_checkpoint) == len(from_save) > 4 and all(
    np.array_equal(a.numpy(), b.numpy()) for a, b in zip(from_checkpoint, from_save)), "the checkpoint differs"
print("OK ModelCheckpoint writes the whole optimizer state", flush=True)
# A model with its own train_step (keras.io's "Customizing what happens in fit()"): sharded through its optimizer.
def own_step_model():
    plain = build()
    return OwnStep(plain.inputs, plain.outputs)


make_optimizer = SET_UPS["Adam with global_clipnorm"]
unsharded = train(tnt.Model(own_step_model()), make_optimizer)
for mode in MODES:
    sharded = train(tnt.Model(own_step_model(), shard=mode), make_optimizer)
    assert_bitwise(unsharded.get_weights(), sharded.get_weights(), f"a model's own train_step sharded {mode!r}")
if size > 1:
    assert len(sharded.optimizer.variables) < len(unsharded.optimizer.variables)
print("OK a model's own train_step trains sharded as unsharded", flush=True)

# Saving it gathers its optimizer's state on the master (Note [Saving a model with its own training logic, sharded]).
own = {"OwnStep": OwnStep}
own_unsharded, own_sharded = os.path.join(directory, "own.keras"), os.path.join(directory, "own_sharded.keras")
own_weights = os.path.join(directory, "own.weights.h5")
unsharded.save(own_unsharded)
unsharded.save_weights(own_weights)
sharded.save(own_sharded)
tnt.barrier()
expected = [v.numpy() for v in keras.saving.load_model(own_unsharded, custom_objects=own).optimizer.variables]
got = [v.numpy() for v in keras.saving.load_model(own_sharded, custom_objects=own).optimizer.variables]
assert len(expected) == len(got) > 4 and all(np.array_equal(a, b) for a, b in zip(expected, got)), \
    "the saved own-step model's optimizer state differs from unsharded training's"


def resumed_own(path, shard=None):
    keras.utils.set_random_seed(3)   # each load draws the Dropout layer's seed state
    model = tnt.models.load_model(path, custom_objects=own, shard=shard)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


expected = resumed_own(own_unsharded)
for path, shard in ((own_sharded, "optimizer"), (own_unsharded, "gradients")):
    assert_bitwise(expected, resumed_own(path, shard), f"an own-step model resumed from {path} sharded {shard!r}")


def reloaded_own(shard=None):
    """Trained an epoch (its optimizer built), then given the saved weights and optimizer state, and trained on."""
    model = train(tnt.Model(own_step_model(), shard=shard), make_optimizer, epochs=1)
    model.load_weights(own_weights)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


assert_bitwise(reloaded_own(), reloaded_own("gradients"), "an own-step model's load_weights sharded")
print("OK a model's own train_step saves sharded as unsharded; load_model and load_weights resume it", flush=True)


# A custom loop: tnt.reduce_gradients, then the sharded optimizer, built by its first apply inside the step.
def custom_loop(optimizer, to_owners=False):
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(33, activation="relu"),
                              keras.layers.Dense(17, activation="tanh"), keras.layers.Dense(3)])
    tnt.broadcast_variables(model.variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(batch, share):
        inputs, targets = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(inputs, training=True))
        gradients = tnt.reduce_gradients(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                         share=share, optimizer=optimizer if to_owners else None)
        optimizer.apply(gradients, model.trainable_variables)

    for _ in range(2):
        for batch, share in tnt.distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)):
            step(batch, share)
    return model.get_weights()


expected = custom_loop(keras.optimizers.AdamW(0.01, weight_decay=0.05))
got = custom_loop(tnt.shard_optimizer(keras.optimizers.AdamW(0.01, weight_decay=0.05)))
assert_bitwise(expected, got, "the custom loop sharded 'optimizer'")
got = custom_loop(tnt.shard_optimizer(keras.optimizers.AdamW(0.01, weight_decay=0.05), mode="gradients"),
                  to_owners=True)
assert_bitwise(expected, got, "the custom loop sharded 'gradients'")
print("OK a custom loop with tnt.shard_optimizer trains as unsharded", flush=True)

# An Embedding's gradient is sparse (tf.IndexedSlices): gathered on every rank, applied by its owner only.
def with_embedding():
    keras.utils.set_random_seed(5)
    tokens = keras.Input((4,), dtype="int32")
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8)(tokens))
    return keras.Model(tokens, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(hidden)))


token_ids = rng.integers(0, 50, (N, 4)).astype(np.int32)
expected = train(tnt.Model(with_embedding()), SET_UPS["Adam with global_clipnorm"], inputs=token_ids).get_weights()
for mode in MODES:
    got = train(tnt.Model(with_embedding(), shard=mode), SET_UPS["Adam with global_clipnorm"],
                inputs=token_ids).get_weights()
    assert_bitwise(expected, got, f"an Embedding's sparse gradients sharded {mode!r}")
print("OK sparse gradients (Embedding) train sharded as unsharded", flush=True)

# As users run it: op determinism on, mixed_float16 with a dynamic loss scale, inputs as a dict (last: both are
# process-wide settings).
tf.config.experimental.enable_op_determinism()
keras.mixed_precision.set_global_policy("mixed_float16")


def two_inputs():
    keras.utils.set_random_seed(3)
    first, second = keras.Input((6,), name="first"), keras.Input((4,), name="second")
    hidden = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([first, second]))
    hidden = keras.layers.Dropout(0.1)(keras.layers.BatchNormalization()(hidden))
    return keras.Model({"first": first, "second": second}, keras.layers.Dense(3, dtype="float32")(hidden))


inputs = {"first": x[:, :6], "second": x[:, 6:]}
make_optimizer = SET_UPS["LossScaleOptimizer(Adam, global_clipnorm)"]
expected = train(tnt.Model(two_inputs()), make_optimizer, inputs=inputs).get_weights()
for mode in MODES:
    got = train(tnt.Model(two_inputs(), shard=mode), make_optimizer, inputs=inputs).get_weights()
    assert_bitwise(expected, got, f"mixed_float16 sharded {mode!r}")
print("OK mixed_float16, op determinism and dict inputs train sharded as unsharded", flush=True)
print("OK done", flush=True)
