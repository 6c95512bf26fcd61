"""A data-parallel job for the fault matrix (tests/cluster/fault_matrix.py).

    fault_program.py MODE STATE_DIR

Every rank trains: a numpy linear model whose gradients are allreduced with
tnt.allreduce each step (`keras` modes: tnt.Model.fit), forever, until the fault
ends the job. Each rank writes its program's pid to STATE_DIR/pid-RANK once it
trains, so the harness can strike mid-step; a rank that commits a fault itself writes the
time to STATE_DIR/fault-RANK first. MODE says what the program itself
does wrong:
  train              nothing (the harness injects the fault from outside)
  keras              the same with tnt.Model.fit (a real Keras training step)
  caught_exception   rank 1 raises in its 3rd step and the user's code catches it
                     and skips that step's gradient exchange; training has a fixed
                     number of steps (CAUGHT_EXCEPTION_STEPS), as real training does:
                     Note [A skipped call among identical calls]
  mismatched_models  rank 1 builds a wider model than the others (tnt.Model)
  early_exit         rank 1 returns from training after 3 steps and exits 0
"""
import os
import sys
import time

import numpy as np

import tarantella as tnt

MODE, STATE = sys.argv[1], sys.argv[2]
RANK = tnt.get_rank()


def _publish(name, text):
    """Written whole or not at all: the test polls for the file and reads it at once."""
    path = os.path.join(STATE, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def ready():
    _publish(f"pid-{RANK}", str(os.getpid()))


def mark_fault():
    _publish(f"fault-{RANK}", repr(time.time()))


# Note [A skipped call among identical calls]
# After rank 1 skips one allreduce, rank 0's k-th call pairs with rank 1's (k+1)-th: same
# size, dtype and op, so no check can tell them apart (a per-call sequence number counts
# calls, and both ranks' k-th calls carry k; Horovod's tensor names repeat every step too).
# What ends the job is the end of training: rank 1 runs out of calls one step early, exits,
# and rank 0's last allreduce times out naming it. An endless loop of identical calls would
# train on, offset by one step, and no system would see it.
CAUGHT_EXCEPTION_STEPS = 50


def numpy_training():
    rng = np.random.default_rng(RANK)
    weights = np.zeros(4096, dtype=np.float32)
    step = 0
    while MODE != "caught_exception" or step < CAUGHT_EXCEPTION_STEPS:
        x = rng.normal(size=(32, 4096)).astype(np.float32)
        gradient = x.T @ (x @ weights - 1.0) / 32
        try:
            if MODE == "caught_exception" and RANK == 1 and step == 3:
                mark_fault()
                raise ValueError("bad batch in step 3")
            gradient = tnt.allreduce(gradient, op="average")
        except ValueError:
            pass  # the user's code skips the bad batch
        weights -= 0.001 * gradient
        step += 1
        if step == 2:
            ready()
        if MODE == "early_exit" and RANK == 1 and step == 3:
            mark_fault()
            return
        time.sleep(0.01)


def keras_training():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    class Ready(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                ready()

    width = 32
    if MODE == "mismatched_models" and RANK == 1:
        mark_fault()
        width = 64
    keras.utils.set_random_seed(1)
    model = tnt.Model(keras.Sequential([keras.Input((16,)), keras.layers.Dense(width, "relu"),
                                        keras.layers.Dense(1)]))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(64 * tnt.get_size(), 16)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=8 * tnt.get_size(), epochs=100000, verbose=0, callbacks=[Ready()])


if MODE in ("keras", "mismatched_models"):
    keras_training()
else:
    numpy_training()
