"""Run on N ranks: callbacks per rank, identical decisions, save/load.
argv[1]: a directory shared by all ranks; each rank writes its results to results-<rank>.json there
(run without --output-on-all-devices, only the master's stdout is shown)."""
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

RANK, SIZE = tnt.get_rank(), tnt.get_size()
OUT = sys.argv[1]


def report(check, **values):
    with open(os.path.join(OUT, f"results-{RANK}.json"), "a") as handle:
        handle.write(json.dumps({"check": check, "rank": RANK, "size": SIZE, **values}) + "\n")


def make():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    return tnt.Model(model)


class Recorder(keras.callbacks.Callback):
    """A user callback: must run unchanged on every rank and see global logs."""
    def __init__(self):
        super().__init__()
        self.epochs, self.batches, self.verbose = [], 0, None

    def on_train_begin(self, logs=None):
        self.verbose = self.params.get("verbose")

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({key: float(value) for key, value in logs.items()})


rng = np.random.default_rng(1)
x = rng.normal(size=(90, 6)).astype("float32")
y = (x[:, :1] * 2 + 0.1 * rng.normal(size=(90, 1))).astype("float32")
x_val, y_val = x[:30] + 3.0, y[:30]  # a validation set the model gets worse on: EarlyStopping fires

model = make()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
recorder = Recorder()
history = model.fit(
    x, y, batch_size=12, epochs=30, validation_data=(x_val, y_val), verbose=1,
    callbacks=[recorder,
               keras.callbacks.EarlyStopping(monitor="val_loss", patience=2),
               keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5),
               keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.99),
               keras.callbacks.TerminateOnNaN(),
               keras.callbacks.CSVLogger(os.path.join(OUT, f"log-from-rank-{RANK}.csv")),
               keras.callbacks.ModelCheckpoint(os.path.join(OUT, f"checkpoint-from-rank-{RANK}.keras"))])
report("callbacks", epochs=len(history.history["loss"]), recorded=recorder.epochs, batches=recorder.batches,
       verbose=recorder.verbose,
       learning_rate=float(model.optimizer.learning_rate.numpy()))
tnt.barrier()

path = os.path.join(OUT, "model.keras")
model.save(path)
tnt.barrier()
plain = keras.saving.load_model(path)
report("plain_keras_load", is_tnt=isinstance(plain, tnt.Model),
       same_weights=all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), model.get_weights())),
       same_predictions=bool(np.allclose(plain.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)))
loaded = tnt.models.load_model(path)
before = loaded.evaluate(x, y, batch_size=15, verbose=0, return_dict=True)
loaded.fit(x, y, batch_size=12, epochs=1, verbose=0)
report("tnt_load", is_tnt=isinstance(loaded, tnt.Model), before=before,
       original=model.evaluate(x, y, batch_size=15, verbose=0, return_dict=True),
       weights_equal_on_ranks=all([np.array_equal(w, tnt.broadcast(w.copy())) for w in loaded.get_weights()]))
