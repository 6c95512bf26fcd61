"""shard="weights" (ZeRO stage 3, issue 21) against unsharded data parallelism and serial Keras.

    tarantella -n N -- sharded_weights.py

Each check trains the same seeded model unsharded and with tnt.Model(model, shard="weights"), and compares the
weights bit for bit (and serial Keras's within 1e-6): a model with BatchNormalization and Dropout under four
optimizer set-ups, a Transformer block (MultiHeadAttention, LayerNormalization, a residual), an Embedding-fed
causal attention block (the Embedding's gradient stays sparse; weights above the engine's eager size), an
activity regularizer, a model built in tnt.deferred_weights() (each rank gives storage to its own weights only),
save (a plain .keras file, equal to unsharded's) and loading it sharded, BackupAndRestore's resume (in
test_own_training_logic.py), and the refusals. Prints "OK <check>".
Grappler's arithmetic optimizer is off, as in sharded_optimizer.py (it rewrites a schedule's tensor by how many
updates consume it).
"""
import contextlib
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt
from optimizer_set_ups import SET_UPS
from own_train_step import OwnStep, TwoOptimizers
from tarantella import stage_state

tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})

rank, size = tnt.get_rank(), tnt.get_size()
rng = np.random.default_rng(0)
N, BATCH = 96, 24
x = rng.standard_normal((N, 10)).astype(np.float32)
y = rng.integers(0, 3, N).astype(np.int32)
sequences = rng.standard_normal((N, 6, 8)).astype(np.float32)


def build():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(33, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dropout(0.2),
                             keras.layers.Dense(17, activation="tanh"), keras.layers.Dense(3)])


def transformer_block():
    keras.utils.set_random_seed(11)
    tokens = keras.Input((6, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1)(tokens, tokens)
    hidden = keras.layers.LayerNormalization()(keras.layers.Add()([tokens, attended]))
    hidden = keras.layers.Dense(16, activation="gelu")(hidden)
    return keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(hidden)))


def with_activity_regularizer():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(24, activation="relu",
                                                                   activity_regularizer=keras.regularizers.L2(0.01)),
                             keras.layers.Dense(3)])


def train(model, make_optimizer, inputs=None, epochs=2):
    model.compile(optimizer=make_optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x if inputs is None else inputs, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


def flat(arrays):
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def assert_bitwise(expected, got, what):
    for index, (a, b) in enumerate(zip(expected, got)):
        assert np.array_equal(a, b), f"rank {rank} {what}: weight {index} differs by {np.max(np.abs(a - b)):.3g}"
    gathered = tnt.allgather(flat(got))
    assert all(np.array_equal(gathered[0], other) for other in gathered[1:]), f"{what}: ranks hold different weights"


def assert_holds_own_share(model, what):
    """This rank holds storage for its own weights only, and together the ranks hold each weight once."""
    held = [v.path for v in model.trainable_variables if not stage_state.is_released(v)]
    together = sorted(path for part in tnt.allgather_object(held) for path in part)
    assert together == sorted(v.path for v in model.trainable_variables), f"{what}: {together}"
    assert size == 1 or len(held) < len(model.trainable_variables), f"rank {rank} {what}: holds every weight"


for name, make_optimizer in SET_UPS.items():
    serial = train(build(), make_optimizer).get_weights()
    expected = train(tnt.Model(build()), make_optimizer).get_weights()
    sharded = train(tnt.Model(build(), shard="weights"), make_optimizer)
    got = sharded.get_weights()
    assert_bitwise(expected, got, f"{name} sharded 'weights' against unsharded")
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(serial, got))
    assert difference < 1e-6, f"rank {rank} {name}: {difference:.3g} from serial"
    assert_holds_own_share(sharded, name)
    print(f"OK {name}: bitwise unsharded (weights), serial within {difference:.1g}", flush=True)
if size > 1:   # how many variables went in parts (Note [Spread transfers]; only across nodes)
    gathering = sharded._gathering
    print(f"SPREAD {gathering._spread.traced + gathering.to_owners._spread.traced}", flush=True)

loss = sharded.evaluate(x, y, batch_size=BATCH, verbose=0)
predictions = sharded.predict(x, batch_size=BATCH, verbose=0)
unsharded = tnt.Model(build())
unsharded.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
unsharded.set_weights(got)
assert loss == unsharded.evaluate(x, y, batch_size=BATCH, verbose=0), "evaluate differs from unsharded"
assert np.array_equal(predictions, unsharded.predict(x, batch_size=BATCH, verbose=0)), "predict differs"
print("OK evaluate and predict give unsharded's results", flush=True)

make_optimizer = SET_UPS["AdamW excluding biases from decay"]
expected = train(tnt.Model(transformer_block()), make_optimizer, inputs=sequences).get_weights()
got = train(tnt.Model(transformer_block(), shard="weights"), make_optimizer, inputs=sequences).get_weights()
assert_bitwise(expected, got, "a Transformer block sharded 'weights'")
print("OK a Transformer block (MultiHeadAttention with dropout) trains as unsharded", flush=True)

def language_model():
    """Embedding, a causal self-attention block (MultiHeadAttention(h, h) on an intermediate tensor, with a residual)
    and a feed-forward block: its weights exceed the engine's eager size (4 KiB), so they travel by rendezvous, and
    a rank owns none of some layers' weights."""
    keras.utils.set_random_seed(5)
    tokens = keras.Input((4,), dtype="int32")
    hidden = keras.layers.Embedding(500, 32)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(hidden, hidden, use_causal_mask=True)
    hidden = keras.layers.LayerNormalization()(hidden + attended)
    hidden = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(hidden))
    return keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(hidden)))


token_ids = rng.integers(0, 500, (N, 4)).astype(np.int32)
# Not bit for bit: the embeddings feed the attention's query, key and value and the residual; unsharded, the tape adds
# those four gradients at once, sharded the layer's three first (Note [Weights gathered layer by layer]). SGD: Adam
# divides a rarely seen embedding row's update by its tiny second moment, so an ulp grows to 1e-6 (measured: with
# AdamW, unsharded data parallelism itself ends 4e-6 from serial Keras on this model).
momentum = SET_UPS["SGD with momentum"]
expected = train(tnt.Model(language_model()), momentum, inputs=token_ids).get_weights()
got = train(tnt.Model(language_model(), shard="weights"), momentum, inputs=token_ids).get_weights()
difference = max(float(np.max(np.abs(a - b))) for a, b in zip(expected, got))
assert difference < 1e-6, f"rank {rank}: an Embedding and causal attention sharded 'weights': {difference:.3g}"
gathered = tnt.allgather(flat(got))
assert all(np.array_equal(gathered[0], other) for other in gathered[1:]), "ranks hold different weights"
print("OK an Embedding-fed causal attention block (weights sent by rendezvous) trains as unsharded", flush=True)

expected = train(tnt.Model(with_activity_regularizer()), make_optimizer).get_weights()
got = train(tnt.Model(with_activity_regularizer(), shard="weights"), make_optimizer).get_weights()
assert_bitwise(expected, got, "an activity regularizer sharded 'weights'")
print("OK an activity regularizer trains as unsharded", flush=True)

# Built without storage: each rank initialises its own weights only, to serial Keras's initial values.
with tnt.deferred_weights():
    deferred = build()
deferred = tnt.Model(deferred, shard="weights")
assert_holds_own_share(deferred, "a model built in deferred_weights()")
assert_bitwise(build().get_weights(), deferred.get_weights(), "deferred initial weights against serial")
assert_bitwise(train(tnt.Model(build()), make_optimizer).get_weights(),
               train(deferred, make_optimizer).get_weights(), "a deferred model trained sharded")
print("OK a model built in deferred_weights() holds its share only, starts and trains as serial", flush=True)

# Saving gathers the weights and the optimizer state on the master: one plain .keras file, unsharded's.
directory = tnt.broadcast_object(tempfile.mkdtemp() if rank == 0 else None)
unsharded_path, sharded_path = os.path.join(directory, "unsharded.keras"), os.path.join(directory, "sharded.keras")
unsharded = train(tnt.Model(build()), make_optimizer)
sharded = train(tnt.Model(build(), shard="weights"), make_optimizer)
unsharded.save(unsharded_path)
sharded.save(sharded_path)
assert_holds_own_share(sharded, "after save")
tnt.barrier()
plain_unsharded, plain_sharded = keras.saving.load_model(unsharded_path), keras.saving.load_model(sharded_path)
assert_bitwise(plain_unsharded.get_weights(), plain_sharded.get_weights(), "the saved weights")
assert_bitwise([v.numpy() for v in plain_unsharded.optimizer.variables],
               [v.numpy() for v in plain_sharded.optimizer.variables], "the saved optimizer state")
print("OK save writes one plain .keras file, equal to unsharded training's", flush=True)
keras.utils.set_random_seed(3)
resumed_unsharded = tnt.models.load_model(unsharded_path)
keras.utils.set_random_seed(3)
resumed_sharded = tnt.models.load_model(sharded_path, shard="weights")
assert_holds_own_share(resumed_sharded, "a loaded model")
for model in (resumed_unsharded, resumed_sharded):
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
assert_bitwise(resumed_unsharded.get_weights(), resumed_sharded.get_weights(), "resumed sharded 'weights'")
print("OK a saved model loads sharded and resumes as unsharded", flush=True)


# A custom loop: tnt.shard_weights, tnt.gathered_gradients and the optimizer sharded with mode="weights", against
# the same loop unsharded (tnt.reduce_gradients of the gradients of share x loss, as gathered_gradients scales).
def custom_loop(sharded: bool, head_only: bool = False):
    keras.utils.set_random_seed(7)
    with tnt.deferred_weights() if sharded else contextlib.nullcontext():   # built as serial Keras builds it
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(33, activation="relu"),
                                  keras.layers.Dense(17, activation="tanh"), keras.layers.Dense(3)])
    if sharded:
        weights = tnt.shard_weights(model)
        assert_holds_own_share(model, "a custom loop's model")
    trained = ([v for layer in model.layers[-2:] for v in layer.trainable_variables] if head_only
               else model.trainable_variables)
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.05)
    if sharded:
        tnt.shard_optimizer(optimizer, trained, mode="weights")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(batch, share):
        inputs, targets = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(inputs, training=True))
        if sharded:
            gradients = tnt.gathered_gradients(tape, loss, trained, share=share)
        else:
            gradients = tnt.reduce_gradients(tape.gradient(loss, trained, output_gradients=share), trained,
                                             share=1.0)
        optimizer.apply(gradients, trained)

    for _ in range(2):
        for batch, share in tnt.distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)):
            step(batch, share)
    return weights.whole_values() if sharded else model.get_weights()


assert_bitwise(custom_loop(sharded=False), custom_loop(sharded=True), "a custom loop sharded 'weights'")
# Only the last two layers trained: the sums of the first layer's gradients are read by nobody, and still received.
# Each rank must own one of the variables an optimizer updates (else a one-line error): true here up to 2 ranks.
if size <= 2:
    assert_bitwise(custom_loop(sharded=False, head_only=True), custom_loop(sharded=True, head_only=True),
                   "a custom loop training the last layers sharded 'weights'")
print("OK a custom loop with tnt.shard_weights and tnt.gathered_gradients trains as unsharded", flush=True)


# A model with its own train_step: its tape gives the owned gradients, summed in the backward pass (Note [Weights
# gathered for a model's own train_step]). Unsharded, the share scales the summed gradients, here the loss's
# gradient: the same bits where the share is a power of two (24-sample batches over 1, 2, 4 ranks).
def own_step_model():
    plain = build()
    return OwnStep(plain.inputs, plain.outputs)


make_optimizer = SET_UPS["Adam with global_clipnorm"]
unsharded = train(tnt.Model(own_step_model()), make_optimizer)
expected = unsharded.get_weights()
sharded = train(tnt.Model(own_step_model(), shard="weights"), make_optimizer)
assert_holds_own_share(sharded, "a model's own train_step")
if size in (1, 2, 4):
    assert_bitwise(expected, sharded.get_weights(), "a model's own train_step sharded 'weights'")
else:
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(expected, sharded.get_weights()))
    assert difference < 1e-6, f"rank {rank} a model's own train_step: {difference:.3g} from unsharded"

# Saved, it is the file unsharded training writes (Note [Saving a model with its own training logic, sharded]),
# and tnt.models.load_model resumes it sharded as unsharded.
own = {"OwnStep": OwnStep}
paths = [os.path.join(directory, name) for name in ("own.keras", "own_sharded.keras")]
unsharded.save(paths[0])
sharded.save(paths[1])
tnt.barrier()
if size in (1, 2, 4):
    files = [keras.saving.load_model(path, custom_objects=own) for path in paths]
    assert_bitwise(files[0].get_weights(), files[1].get_weights(), "the saved own-step model's weights")
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(
        files[0].optimizer.variables, files[1].optimizer.variables)), "the saved own-step model's optimizer state"
    resumed = []
    for path, shard in zip(paths, (None, "weights")):
        keras.utils.set_random_seed(3)   # each load draws the Dropout layer's seed state
        model = tnt.models.load_model(path, custom_objects=own, shard=shard)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        resumed.append(model.get_weights())
    assert_bitwise(*resumed, "an own-step model resumed sharded 'weights'")


def two_optimizers(shard):
    keras.utils.set_random_seed(3)
    model = TwoOptimizers(keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                            keras.layers.Dense(8)]),
                          keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                            keras.layers.Dense(3)]))
    model(x[:1])
    model = tnt.Model(model, shard=shard)
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


if size <= 2:   # each rank owns one of each optimizer's variables up to 2 ranks (else a one-line error)
    assert_bitwise(two_optimizers(None), two_optimizers("weights"), "two optimizers in a model's own train_step")
print("OK a model's own train_step trains, saves and resumes sharded 'weights' as unsharded", flush=True)


def refused(make, words):
    try:
        make()
    except ValueError as error:
        assert words in str(error), error
        return
    raise AssertionError(f"expected a refusal saying {words!r}")


if size > 1:
    def regularized():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((10,)), keras.layers.Dense(
            4, kernel_regularizer=keras.regularizers.L2(0.01)), keras.layers.Dense(3)])

    refused(lambda: tnt.Model(regularized(), shard="weights"), "weight regularizers")
    refused(lambda: tnt.shard_optimizer(keras.optimizers.Adam(), build().trainable_variables, mode="weights"),
            "are not among them")
    refused(lambda: tnt.gathered_gradients(None, 0.0, build().trainable_variables), "use tnt.reduce_gradients")
    refused(lambda: tnt.Model(build(), parallel_strategy=tnt.ParallelStrategy.ALL, shard="weights"),
            "not available with pipelining")
    refused(lambda: tnt.broadcast_variables(tnt.Model(build(), shard="weights").variables), "broadcast before it")
    refused(lambda: tnt.Model(keras.Sequential([keras.layers.Dense(3)]), shard="weights"), "is not built")
print("OK unsupported uses are refused with one line", flush=True)

# As users run it, last (process-wide settings): op determinism on, mixed_float16 with a dynamic loss scale.
tf.config.experimental.enable_op_determinism()
keras.mixed_precision.set_global_policy("mixed_float16")
make_optimizer = lambda: keras.optimizers.LossScaleOptimizer(  # noqa: E731
    keras.optimizers.Adam(0.01, global_clipnorm=0.05), initial_scale=2.0 ** 20, dynamic_growth_steps=2)
expected = train(tnt.Model(build()), make_optimizer).get_weights()
got = train(tnt.Model(build(), shard="weights"), make_optimizer).get_weights()
assert_bitwise(expected, got, "mixed_float16 sharded 'weights'")
print("OK mixed_float16 with a LossScaleOptimizer and op determinism train as unsharded", flush=True)
print("OK done", flush=True)
