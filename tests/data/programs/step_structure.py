"""Each rank: for every input form Keras accepts, the structure a model's own train/test/predict step
receives under tnt.Model equals what plain Keras hands the same model (nesting, tuple lengths, a bare
tensor where Keras gives one; shapes past the batch dimension and dtypes). Prints one line per form:
"STRUCTURE <form> ok" or "STRUCTURE <form> DIFFERS keras=... tnt=...". (issue 22 §1)"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402

SAMPLES, BATCH = 12, 6  # 6 rows a global batch: 3 ranks get 2 each


def describe(data):
    """The structure with each tensor's (shape past the batch dimension, dtype)."""
    return tf.nest.map_structure(lambda t: None if t is None else (tuple(t.shape[1:]), t.dtype.name), data)


class Probe(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.seen = {}

    def call(self, x):
        first = tf.cast(tf.nest.flatten(x)[0], tf.float32)
        return self.dense(tf.reshape(first, [-1, 3]))

    def _record(self, kind, data):
        self.seen.setdefault(kind, repr(describe(data)))

    def train_step(self, data):
        self._record("train", data)
        x = tf.nest.flatten(data)[0]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self(x) ** 2)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}

    def test_step(self, data):
        self._record("test", data)
        return {"loss": tf.reduce_mean(self(tf.nest.flatten(data)[0]) ** 2)}

    def predict_step(self, data):
        self._record("predict", data)
        return self(tf.nest.flatten(data)[0])


x = np.arange(SAMPLES * 3, dtype=np.float32).reshape(SAMPLES, 3)
y = np.ones((SAMPLES, 1), np.float32)
sw = np.ones((SAMPLES,), np.float32)
words = np.array([["a"], ["b"]] * (SAMPLES // 2), dtype=object)


class Batches(keras.utils.PyDataset):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def __len__(self):
        return SAMPLES // BATCH

    def __getitem__(self, i):
        return self.make(slice(i * BATCH, (i + 1) * BATCH))


def generator(make):
    while True:
        for i in range(SAMPLES // BATCH):
            yield make(slice(i * BATCH, (i + 1) * BATCH))


def dataset(parts):
    return tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)


# name -> (fit kwargs, predict x or None); every entry runs fit, evaluate (same input) and predict
FORMS = {
    "array x": dict(x=x),
    "array x,y": dict(x=x, y=y),
    "array x,y,sample_weight": dict(x=x, y=y, sample_weight=sw),
    "list [x,x]": dict(x=[x, x]),
    "tuple (x,x)": dict(x=(x, x)),
    "dict {a,b}": dict(x={"a": x, "b": 2 * x}),
    "dict {a},y": dict(x={"a": x}, y=y),
    "list [x,x],y": dict(x=[x, x], y=y),
    "nested {a:(x,x)},y": dict(x={"a": (x, x)}, y=y),
    "tf.data x": dict(x=dataset(x)),
    "tf.data (x,)": dict(x=dataset((x,))),
    "tf.data (x,y)": dict(x=dataset((x, y))),
    "tf.data {a,b}": dict(x=dataset({"a": x, "b": words})),
    "tf.data ({a},y,sw)": dict(x=dataset(({"a": x}, y, sw))),
    "PyDataset x": dict(x=Batches(lambda s: x[s])),
    "PyDataset (x,y)": dict(x=Batches(lambda s: (x[s], y[s]))),
    "PyDataset {a}": dict(x=Batches(lambda s: {"a": x[s]})),
    "generator (x,)": dict(x=lambda: generator(lambda s: (x[s],)), steps=SAMPLES // BATCH),
    "generator (x,y)": dict(x=lambda: generator(lambda s: (x[s], y[s])), steps=SAMPLES // BATCH),
}


def run(form, wrapped):
    keras.utils.set_random_seed(1)
    probe = Probe()
    model = tnt.Model(probe) if wrapped else probe
    model.compile(optimizer="sgd")
    kwargs = dict(FORMS[form])
    steps = kwargs.pop("steps", None)
    source = kwargs.pop("x")
    data = source if not callable(source) else None
    batch_size = BATCH if data is not None and not isinstance(data, (tf.data.Dataset, keras.utils.PyDataset)) \
        else None
    model.fit(source() if data is None else data, **kwargs, batch_size=batch_size, epochs=1, verbose=0,
              steps_per_epoch=steps, shuffle=False)
    model.evaluate(source() if data is None else data, **kwargs, batch_size=batch_size, verbose=0, steps=steps)
    model.predict(source() if data is None else data, batch_size=batch_size, verbose=0, steps=steps)
    return probe.seen


for form in FORMS:
    serial, distributed = run(form, False), run(form, True)
    if serial == distributed:
        print(f"STRUCTURE {form} ok", flush=True)
    else:
        print(f"STRUCTURE {form} DIFFERS keras={serial} tnt={distributed}", flush=True)
