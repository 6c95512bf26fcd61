"""Run on N ranks: the metric state reduced with the gradients (Note [Metric state rides with the
gradients] in tarantella/step/metric_reduction.py) against the separate reduction after them, and
against serial Keras. Prints `RESULT <json>` per check; tests/keras/test_metrics_with_gradients.py reads them."""
import json
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

RANK, SIZE = tnt.get_rank(), tnt.get_size()
rng = np.random.default_rng(0)
N = 101  # global batch 10: the last batch has 1 sample, so ranks beyond the first get an empty micro-batch
x = rng.normal(size=(N, 8)).astype("float32")
y = rng.integers(0, 4, size=N)


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append({key: float(value) for key, value in logs.items()})


def train(kind):
    model = build() if kind == "serial" else tnt.Model(build())
    if kind == "after":
        model._metrics_ride = False
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")],
                  jit_compile=False)
    batches = BatchLogs()
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0, callbacks=[batches])
    purposes = sorted({purpose for purpose, _ in getattr(model, "_allreducers", [])})  # the train step's
    evaluated = model.evaluate(x, y, batch_size=10, verbose=0, return_dict=True)
    riding = getattr(model, "_metric_state_count", 0)
    return model, history.history, batches.logs, evaluated, purposes, riding


runs = {kind: train(kind) for kind in ("serial", "riding", "after")}


def worst(a, b):
    return max(abs(u - v) / max(abs(u), 1e-12) for u, v in zip(a, b))


serial, riding, after = runs["serial"], runs["riding"], runs["after"]
print("RESULT " + json.dumps({
    "rank": RANK, "size": SIZE,
    "riding_purposes": riding[4], "after_purposes": after[4],
    "riding_state_tensors": riding[5], "after_state_tensors": after[5],
    "batch_logs_identical": riding[2] == after[2],
    "epoch_logs_identical": riding[1] == after[1],
    "evaluate_identical": riding[3] == after[3],
    "weights_identical": all(np.array_equal(a, b) for a, b in zip(riding[0].get_weights(), after[0].get_weights())),
    "steps": len(riding[2]),
    "keys": sorted(riding[1]),
    "history_vs_serial": max(worst(serial[1][key], riding[1][key]) for key in serial[1]),
    "batch_metrics_vs_serial": max(worst([s[k] for s in serial[2]], [r[k] for r in riding[2]])
                                   for k in ("accuracy", "top2")),
}), flush=True)
