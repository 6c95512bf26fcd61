"""Run on N ranks, twice with the same command: BackupAndRestore resume is bitwise equal to an uninterrupted run.
argv[1]: a directory shared by the ranks. The first launch trains uninterrupted (reference), then trains
again with BackupAndRestore and kills itself (os._exit, every rank) in epoch 3, batch 2 (a marker file
says it did). The second, identical launch resumes from the master's backup and compares with the
reference; one `RESULT <json>` line per rank. With SHARD=optimizer, gradients or weights in the environment the
model's training state is sharded (ZeRO stage 1, 2 or 3): every rank joins the master's backups, and on resume
takes its share of the restored state (and, stage 3, of the weights) from the master. With OWN_STEP=1 the model
has its own train_step."""
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from own_train_step import OwnStep  # noqa: E402

RANK, SIZE = tnt.get_rank(), tnt.get_size()
OUT = sys.argv[1]
EPOCHS, KILL_EPOCH, KILL_BATCH = 4, 2, 2  # zero-based: epoch 3 of 4
rng = np.random.default_rng(0)
x = rng.normal(size=(70, 6)).astype("float32")
y = rng.integers(0, 3, size=70)


def make():
    keras.utils.set_random_seed(21)
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    if os.environ.get("OWN_STEP"):   # its own train_step (keras.io's "Customizing what happens in fit()")
        plain = OwnStep(plain.inputs, plain.outputs)
    model = tnt.Model(plain, shard=os.environ.get("SHARD", "off"))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class KillOnce(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        marker = os.path.join(OUT, f"killed-{RANK}")
        if self._epoch == KILL_EPOCH and batch == KILL_BATCH and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


reference_path = os.path.join(OUT, f"reference-{RANK}.npz")
if not os.path.exists(reference_path):
    reference = make()
    reference.fit(x, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
    np.savez(reference_path, *reference.get_weights())
tnt.barrier()

model = make()
backup = os.path.join(OUT, "backup")
resumed = os.path.exists(os.path.join(OUT, f"killed-{RANK}"))
history = model.fit(x, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup), KillOnce()])
expected = np.load(reference_path)
print("RESULT " + json.dumps({
    "check": "resume", "rank": RANK, "size": SIZE, "resumed": resumed, "epochs_run": len(history.history["loss"]),
    "bitwise_equal": all(np.array_equal(expected[f"arr_{i}"], w) for i, w in enumerate(model.get_weights()))}),
    flush=True)
