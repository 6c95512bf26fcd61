"""On 2 ranks: bad pipelines fail before training with clear errors on every
rank; a model without SplitLayers is cut automatically (the cut is printed) and
trains like serial Keras. Prints "OK <check>"."""
import keras
import numpy as np

import tarantella as tnt
from tarantella.keras.layers import SplitLayer
from tarantella.pipeline import make_pipelined_model

assert tnt.get_size() == 2


def expect(what, needle, build):
    try:
        build()
    except ValueError as error:
        assert needle in str(error), f"{what}: {error}"
        print(f"OK {what}", flush=True)
        return
    raise AssertionError(f"{what}: no error")


def chain(cuts, widths=(16, 16, 16, 16)):
    keras.utils.set_random_seed(11)
    x = keras.Input((5,), name="x")
    h = x
    for i, width in enumerate(widths):
        h = keras.layers.Dense(width, activation="tanh", name=f"d{i}")(h)
        if i in cuts:
            h = SplitLayer(name=f"split{i}")(h)
    return keras.Model(x, keras.layers.Dense(2, name="out")(h))


def late_input():
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    h = SplitLayer()(keras.layers.Dense(4, name="d")(a))
    return keras.Model([a, b], keras.layers.Concatenate(name="late")([h, b]))


expect("stage count must divide the ranks", "3 pipeline stages do not divide the 2 ranks",
       lambda: make_pipelined_model(chain({0, 1}), num_micro_batches=2, data_parallel=True))
expect("inputs on the first stage", "reads the model input(s)",
       lambda: make_pipelined_model(late_input(), num_micro_batches=2))
expect("splits and stage count agree", "cut it into 3 stages",
       lambda: make_pipelined_model(chain({0, 1}), num_micro_batches=2, num_pipeline_stages=2))

rng = np.random.default_rng(0)
x, y = rng.standard_normal((32, 5)).astype("float32"), rng.standard_normal((32, 2)).astype("float32")
serial = chain(set())
serial.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
serial_history = serial.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
for balance_by in ("time", "parameters"):
    model = make_pipelined_model(chain(set()), num_micro_batches=2, num_pipeline_stages=2, balance_by=balance_by)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(history["loss"], serial_history["loss"], rtol=1e-5)
    for got, want in zip(model.get_weights(), serial.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    print(f"OK automatic cut by {balance_by} trains like serial", flush=True)
# A new user's first try: tnt.Model with the PIPELINING strategy and no micro-batch count.
model = tnt.Model(chain({1}), parallel_strategy=tnt.ParallelStrategy.PIPELINING)
assert model.num_micro_batches == 8, model.num_micro_batches  # the documented default, 4 per stage
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
np.testing.assert_allclose(history["loss"], serial_history["loss"], rtol=1e-5)
print("OK default micro-batch count trains like serial", flush=True)
# Logs that the step's log vector cannot carry (a metric with one value per output) reach every rank
# through the Python broadcast (Note [The logs travel in the step]); scalar ones travel in the step.
metrics = lambda: ["mae", keras.metrics.R2Score(class_aggregation=None)]  # noqa: E731
serial = chain(set())
serial.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=metrics())
serial_history = serial.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
model = make_pipelined_model(chain({1}), num_micro_batches=2)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=metrics())
history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
assert sorted(history) == sorted(serial_history), (sorted(history), sorted(serial_history))
for key in serial_history:
    np.testing.assert_allclose(np.array(history[key], dtype=float), np.array(serial_history[key], dtype=float),
                               rtol=1e-4, atol=1e-6, err_msg=key)
print("OK logs the step cannot carry reach every rank like serial's", flush=True)
print("OK done", flush=True)
