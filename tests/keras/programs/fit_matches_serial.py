"""Run on N ranks: distributed training (tnt.Model) against plain serial Keras on
every rank, for several models and input kinds; one JSON line per check.

Each rank prints `RESULT <json>` lines; tests/keras/test_data_parallel.py reads them.
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402

RANK, SIZE = tnt.get_rank(), tnt.get_size()
EPOCHS = 3


def report(check, **values):
    print("RESULT " + json.dumps({"check": check, "rank": RANK, "size": SIZE, **values}), flush=True)


def relative_difference(a, b):
    """max over tensors of max|a-b| / max|a| (scale-relative: elementwise ratios blow up near zero)."""
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-12)) for x, y in zip(a, b))


def history_difference(serial, distributed):
    worst = 0.0
    for key, values in serial.history.items():
        other = np.asarray(distributed.history[key])
        worst = max(worst, float(np.max(np.abs(np.asarray(values) - other) / np.maximum(np.abs(values), 1e-12))))
    return worst


def mlp(batch_norm=False):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(1e-3))]
    return keras.Sequential(layers)


def cnn(batch_norm=False):
    keras.utils.set_random_seed(2)
    layers = [keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(3)]
    return keras.Sequential(layers)


def two_inputs():
    keras.utils.set_random_seed(3)
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(5)(a), b])
    return keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(h))


def compile_args(optimizer="sgd"):
    opt = keras.optimizers.SGD(0.05, momentum=0.5) if optimizer == "sgd" else keras.optimizers.Adam(1e-2)
    return dict(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"], jit_compile=False)


def pair(make, optimizer="sgd", **extra):
    """The same model twice: plain serial Keras, and tnt.Model."""
    serial = make(**extra)
    serial.compile(**compile_args(optimizer))
    distributed = tnt.Model(make(**extra))
    distributed.compile(**compile_args(optimizer))
    return serial, distributed


rng = np.random.default_rng(0)
N = 103  # uneven: partial last batches, and empty micro-batches on some rank counts
x = rng.normal(size=(N, 8)).astype("float32")
y = rng.integers(0, 3, size=N)
images = rng.normal(size=(N, 8, 8, 2)).astype("float32")


def compare(check, serial, distributed, hs, hd, **more):
    report(check, weights=relative_difference(serial.get_weights(), distributed.get_weights()),
           history=history_difference(hs, hd), history_keys=sorted(hd.history), epochs=len(hd.history["loss"]),
           logs=hd.history, **more)


# 1. MLP, numpy arrays, global batch 10 (last batch 3), validation_split, momentum SGD, L2 regulariser.
serial, distributed = pair(mlp)
hs = serial.fit(x, y, batch_size=10, epochs=EPOCHS, shuffle=False, validation_split=0.2, verbose=0)
hd = distributed.fit(x, y, batch_size=10, epochs=EPOCHS, shuffle=False, validation_split=0.2, verbose=0)
compare("mlp_arrays", serial, distributed, hs, hd)
report("mlp_evaluate", serial=serial.evaluate(x, y, batch_size=7, verbose=0),
       distributed=distributed.evaluate(x, y, batch_size=7, verbose=0))
report("mlp_predict", difference=float(np.max(np.abs(serial.predict(x, batch_size=9, verbose=0)
                                                      - distributed.predict(x, batch_size=9, verbose=0)))),
       shape=list(distributed.predict(x, batch_size=9, verbose=0).shape))

# 2. CNN, batched tf.data with tf.data validation, Adam.
train = tf.data.Dataset.from_tensor_slices((images, y)).batch(12)
validation = tf.data.Dataset.from_tensor_slices((images[:41], y[:41])).batch(8)
serial, distributed = pair(cnn, "adam")
hs = serial.fit(train, epochs=EPOCHS, validation_data=validation, verbose=0)
hd = distributed.fit(train, epochs=EPOCHS, validation_data=validation, verbose=0)
compare("cnn_dataset", serial, distributed, hs, hd)

# 3. Unbatched tf.data with micro-batch sizes: global batch = 3 * ranks.
serial, distributed = pair(mlp, "adam")
samples = tf.data.Dataset.from_tensor_slices((x, y))
hs = serial.fit(samples.batch(3 * SIZE), epochs=EPOCHS, validation_data=samples.batch(2 * SIZE), verbose=0)
hd = distributed.fit(samples, epochs=EPOCHS, validation_data=samples, tnt_micro_batch_size=3,
                     tnt_validation_micro_batch_size=2, verbose=0)
compare("mlp_micro_batches", serial, distributed, hs, hd)

# 4. Dict inputs with sample weights, regression, validation_data as arrays.
features = {"a": rng.normal(size=(N, 4)).astype("float32"), "b": rng.normal(size=(N, 3)).astype("float32")}
target = rng.normal(size=(N, 1)).astype("float32")
weights = rng.uniform(0.5, 2.0, size=N).astype("float32")
models = []
for make in (two_inputs, lambda: tnt.Model(two_inputs())):
    model = make()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], jit_compile=False)
    models.append(model)
serial, distributed = models
hs = serial.fit(features, target, sample_weight=weights, batch_size=16, epochs=EPOCHS, shuffle=False,
                validation_data=(features, target), verbose=0)
hd = distributed.fit(features, target, sample_weight=weights, batch_size=16, epochs=EPOCHS, shuffle=False,
                     validation_data=(features, target), verbose=0)
compare("dict_inputs", serial, distributed, hs, hd)

# 4b. A model compiled before wrapping keeps its compile settings.
serial = mlp()
serial.compile(**compile_args("adam"))
hs = serial.fit(x, y, batch_size=20, epochs=EPOCHS, shuffle=False, verbose=0)
compiled = mlp()
compiled.compile(**compile_args("adam"))
distributed = tnt.Model(compiled)
hd = distributed.fit(x, y, batch_size=20, epochs=EPOCHS, shuffle=False, verbose=0)
compare("compiled_before_wrapping", serial, distributed, hs, hd)

# 4c. A subclassed model, unbuilt when wrapped (built from the first micro-batch).
class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))


def subclassed():
    keras.utils.set_random_seed(4)
    return Subclassed()


serial, distributed = pair(subclassed, "adam")
hs = serial.fit(x, y, batch_size=12, epochs=EPOCHS, shuffle=False, verbose=0)
hd = distributed.fit(x, y, batch_size=12, epochs=EPOCHS, shuffle=False, verbose=0)
compare("subclassed_unbuilt", serial, distributed, hs, hd)

# 5. BatchNorm: the global batch's statistics, so results equal serial's at every rank count.
serial, distributed = pair(cnn, "sgd", batch_norm=True)
hs = serial.fit(images, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
hd = distributed.fit(images, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
trainable = [v.numpy() for v in distributed.trainable_variables]
moving = [v.numpy() for v in distributed.non_trainable_variables]
report("batch_norm", weights=relative_difference(serial.get_weights(), distributed.get_weights()),
       history=history_difference(hs, hd),
       trainable_equal_on_ranks=all([np.array_equal(t, tnt.broadcast(t.copy())) for t in trainable]),
       moving_stats_equal_on_ranks=all([np.array_equal(m, tnt.broadcast(m.copy())) for m in moving]))

# 6. shuffle=True: every epoch, the ranks together see each sample exactly once.
from tarantella.data import user_input  # noqa: E402
ids = np.arange(N, dtype=np.int64).reshape(N, 1)
dataset = user_input.distribute(ids, batch_size=10, shuffle=True, seed=1234, size=SIZE, rank=RANK)
epochs_seen = []
for _ in range(2):
    mine = np.concatenate([element["tnt_data"].numpy().ravel() for element in dataset])
    everyone = np.concatenate(tnt.allgather_object(mine))
    epochs_seen.append(sorted(everyone.tolist()) == list(range(N)))
report("shuffle", every_epoch_a_permutation=all(epochs_seen))

# 7. Ranks start from the master's weights even when each rank seeds differently.
keras.utils.set_random_seed(100 + RANK)
unseeded = tnt.Model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)]))
report("initial_weights", equal_to_master=all([np.array_equal(w, tnt.broadcast(w.copy()))
                                               for w in unseeded.get_weights()]))

# 8. A global batch smaller than the rank count is an error.
if SIZE > 1:
    try:
        pair(mlp)[1].fit(x, y, batch_size=SIZE - 1, verbose=0)
        report("small_batch", raised=False)
    except ValueError as error:
        report("small_batch", raised=True, message=str(error))
