"""tnt.Model.fit under `tarantella --elastic`, with faults the program makes itself.

    elastic_fit.py [--data arrays|dataset|repeat|steps|dict] [--fault GEN:RANK:STEP:HOW ...] [--shard MODE]

A model with BatchNormalization and Dropout (state the step changes beside the weights) trains 3 epochs of 8
global batches of 16 on a seeded input, reshuffled every epoch. --fault 1:1:11:kill makes rank 1 of
generation 1 act when the optimizer has done 11 steps (epoch 2, batch 3): HOW is kill (SIGKILL), stop
(SIGSTOP: it hangs), raise (a ValueError: the program fails on its own), pause (writes
STATE/paused-GEN and waits for STATE/go-GEN: the harness makes a fault meanwhile, such as a link cut) or hosts
(puts HOSTFILE.next in place of the job's HOSTFILE, given with --hostfile, and goes on once the launcher asked
the ranks to leave for a resize);
commitkill kills the rank in its commit of that step, after the files are written and before they are
renamed into place (a rank that writes no part of the commit is not killed). Printed: `FAULT {...}` by the
faulty rank (with the time), `RESUMED {...}` by rank 0 of a later generation after its first trained step (with the
commit's step),
and at the end `RESULT {...}` by rank 0: the weights, their sha256, the generation and the world size.
"""
import argparse
import hashlib
import json
import os
import signal
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--data", choices=["arrays", "dataset", "repeat", "steps", "dict"], default="dataset",
                    help="repeat: the dataset repeated forever, fit with steps_per_epoch=8; steps: not repeated, "
                         "with steps_per_epoch=4; dict: numpy arrays in a dict and no targets (the target is one "
                         "of the dict's entries, and the model adds its own loss)")
parser.add_argument("--fault", action="append", default=[])
parser.add_argument("--state", default=None, help="a directory shared with the harness (pause faults)")
parser.add_argument("--hostfile", default=None, help="the job's hostfile (hosts faults)")
parser.add_argument("--shard", default=None, choices=["optimizer", "gradients", "weights"],
                    help="tnt.Model's shard= (each rank commits its own share)")
parser.add_argument("--policy", default=None, help="a Keras dtype policy for the model, e.g. mixed_float16")
args = parser.parse_args()
GENERATION = int(os.environ.get("TNT_ELASTIC_GENERATION", "1"))
RANK = tnt.get_rank()
FAULTS = {}
for spec in args.fault:
    generation, rank, step, how = spec.split(":")
    FAULTS[(int(generation), int(rank))] = (int(step), how)


# A later generation: the commit's step, the optimizer's count as the first batch begins (the resumed epoch's
# batches before it are read and dropped, the count unmoved). Not an attribute of the callback: an elastic job
# commits its callbacks' attributes, and this one is this process's own.
FROM_STEP = []


class Faults(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if GENERATION > 1 and RANK == 0 and not FROM_STEP:
            FROM_STEP.append(int(self.model.optimizer.iterations.numpy()))

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if FROM_STEP and step == FROM_STEP[0] + 1:   # the first step this generation trained
            print("RESUMED " + json.dumps({"from_step": FROM_STEP[0], "time": time.time(),
                                           "size": tnt.get_size()}), flush=True)
        fault = FAULTS.get((GENERATION, RANK))
        if fault and step == fault[0] and fault[1] != "commitkill":
            print("FAULT " + json.dumps({"how": fault[1], "rank": RANK, "step": step, "time": time.time()}),
                  flush=True)
            if fault[1] == "raise":
                raise ValueError(f"rank {RANK} fails on its own at step {step}")
            if fault[1] == "pause":   # the harness makes the fault (a link cut), then lets it go on
                open(os.path.join(args.state, f"paused-{GENERATION}"), "w").close()
                go, deadline = os.path.join(args.state, f"go-{GENERATION}"), time.time() + 120
                while not os.path.exists(go) and time.time() < deadline:
                    time.sleep(0.05)
                return
            if fault[1] == "hosts":   # the launcher reads the hostfile again, and the ranks leave at a step's end
                from tarantella.elastic import committing
                os.replace(args.hostfile + ".next", args.hostfile)
                deadline = time.time() + 120   # goes on once asked, mid-epoch (the other ranks wait in the step)
                while not committing.resize_request().asked and time.time() < deadline:
                    time.sleep(0.05)
                return
            os.kill(os.getpid(), signal.SIGKILL if fault[1] == "kill" else signal.SIGSTOP)


if any(how == "commitkill" for _, how in FAULTS.values()):
    # Killed in the middle of its host's commit: the commit is written, not yet renamed into place.
    from tarantella.elastic import commit_store
    _write = commit_store.write

    def write_then_die(root, arrays, meta):
        fault = FAULTS.get((GENERATION, RANK))
        if fault and fault[1] == "commitkill" and meta["global_step"] == fault[0]:
            real_rename = os.rename
            os.rename = lambda *_: (print("FAULT " + json.dumps({"how": "commitkill", "rank": RANK,
                                                                 "step": fault[0], "time": time.time()}),
                                          flush=True), os.kill(os.getpid(), signal.SIGKILL), real_rename)
        return _write(root, arrays, meta)
    commit_store.write = write_then_die

class SquaredError(keras.layers.Layer):
    """The model's own loss, for inputs without targets: the target travels in the input dict."""

    def call(self, prediction, target):
        self.add_loss(keras.ops.mean(keras.ops.square(prediction - target)))
        return prediction


def layers():
    return [keras.layers.Dense(12, use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"), keras.layers.Dropout(0.3), keras.layers.Dense(1)]


def dict_model():
    """The same layers on two named inputs and the target as a third, the loss the model's own."""
    a, b, target = keras.Input((3,), name="a"), keras.Input((3,), name="b"), keras.Input((1,), name="target")
    hidden = keras.layers.Concatenate()([a, b])
    for layer in layers():
        hidden = layer(hidden)
    return keras.Model({"a": a, "b": b, "target": target}, SquaredError()(hidden, target))


keras.utils.set_random_seed(7)
if args.policy:
    keras.mixed_precision.set_global_policy(args.policy)
if args.data == "dict":
    model = tnt.Model(dict_model(), shard=args.shard)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
else:
    model = tnt.Model(keras.Sequential([keras.Input((6,)), *layers()]), shard=args.shard)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
rng = np.random.default_rng(3)
x = rng.normal(size=(128, 6)).astype(np.float32)
y = (x[:, :1] * 2 - x[:, 1:2] + 0.1 * x[:, 2:3] ** 2).astype(np.float32)
# Callbacks with state of their own, committed too: the patience count and best value; the learning rate they
# change is the optimizer's.
stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=50, min_delta=1.0)
plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss" if args.data == "dict" else "mae", factor=0.5,
                                            patience=0, min_delta=0.3)
callbacks = [Faults(), stopping, plateau]
if args.data in ("dataset", "repeat", "steps"):
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(128, seed=11, reshuffle_each_iteration=True).batch(16)
    if args.data == "repeat":
        history = model.fit(data.repeat(), epochs=3, steps_per_epoch=8, verbose=0, callbacks=callbacks)
    elif args.data == "steps":
        history = model.fit(data, epochs=3, steps_per_epoch=4, verbose=0, callbacks=callbacks)
    else:
        history = model.fit(data, epochs=3, verbose=0, callbacks=callbacks)
elif args.data == "dict":
    history = model.fit({"a": x[:, :3], "b": x[:, 3:], "target": y}, batch_size=16, epochs=3, verbose=0,
                        callbacks=callbacks)
else:
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=callbacks)
weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()
if RANK == 0:
    print("RESULT " + json.dumps({"weights_sha256": digest, "generation": GENERATION, "size": tnt.get_size(),
                                  "weights": [w.tolist() for w in weights], "history": history.history,
                                  "callbacks": {"stopping": [stopping.wait, float(stopping.best)],
                                                "plateau": [plateau.wait, float(plateau.best)],
                                                "learning_rate": float(model.optimizer.learning_rate.numpy())},
                                  "steps": int(model.optimizer.iterations.numpy())}), flush=True)
