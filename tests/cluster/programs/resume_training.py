"""Data-parallel training with keras.callbacks.BackupAndRestore, killed in epoch 2 on
its first run; run again with the same command it resumes from the backup.

    resume_training.py STATE_DIR [uninterrupted]

The first run (no STATE_DIR/killed marker) kills rank 1 with SIGKILL in the middle of
epoch 2 (after its 3rd batch), as a node failure would; every later run trains to the
end. `uninterrupted` never kills. At the end every rank prints
`RESULT {"rank", "weights_sha256", "epochs_run"}`.
"""
import hashlib
import json
import os
import signal
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

STATE = sys.argv[1]
KILL = sys.argv[2:] != ["uninterrupted"]
EPOCHS, KILL_EPOCH, KILL_BATCH = 3, 1, 2  # 0-based: epoch 2, batch 3
MARKER = os.path.join(STATE, "killed")
RANK = tnt.get_rank()


class KillInEpoch2(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = None
        self.epochs_run = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.epochs_run.append(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if KILL and RANK == 1 and self.epoch == KILL_EPOCH and batch == KILL_BATCH \
                and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


keras.utils.set_random_seed(3)
model = tnt.Model(keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, "relu"),
                                    keras.layers.Dense(1)]))
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
data = np.random.default_rng(5)
x = data.normal(size=(256, 10)).astype(np.float32)
y = (x[:, :1] * 2 - x[:, 1:2]).astype(np.float32)
tracker = KillInEpoch2()
model.fit(x, y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore(os.path.join(STATE, "backup")), tracker])
weights = model.get_weights()
print("RESULT " + json.dumps({
    "rank": RANK, "epochs_run": tracker.epochs_run,
    "weights_sha256": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()}),
    flush=True)
