"""Pipelined training equals serial Keras training.

    check_against_serial.py STAGES [--data-parallel] [--save DIR] [--deterministic]

Runs on STAGES x replicas ranks. A model with two inputs and three outputs
(one computed in the first stage and passed through to the last), two tensors
crossing every cut, is trained with both schedules from the same seed and data
as a serial Keras model (computed on every rank); per-step losses, weights,
evaluate and predict must agree within 1e-5 relative. Prints "OK <check>".
"""
import argparse
import os

import keras
import numpy as np

import tarantella as tnt
from tarantella.keras.layers import SplitLayer
from tarantella.pipeline import load_model
from tarantella.pipelining.schedules import Pass, max_live_micro_batches

parser = argparse.ArgumentParser()
parser.add_argument("stages", type=int)
parser.add_argument("--data-parallel", action="store_true")
parser.add_argument("--save", default=None)
parser.add_argument("--deterministic", action="store_true",
                    help="enable_op_determinism first (what tnt.set_deterministic and tnt-repro set)")
args = parser.parse_args()
if args.deterministic:
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()
rank, size = tnt.get_rank(), tnt.get_size()
RTOL, ATOL = 1e-5, 1e-6


def build(stages: int, splits: bool = True) -> keras.Model:
    keras.utils.set_random_seed(7)
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    h1 = keras.layers.Dense(8, activation="tanh", name="in_a")(a)
    h2 = keras.layers.Dense(8, activation="tanh", name="in_b")(b)
    aux = keras.layers.Dense(1, name="aux")(h1)
    for k in range(stages - 1):
        if splits:
            h1, h2 = SplitLayer(name=f"split_a{k}")(h1), SplitLayer(name=f"split_b{k}")(h2)
        joined = keras.layers.Concatenate(name=f"join{k}")([h1, h2])
        h1 = keras.layers.Dense(8, activation="tanh", name=f"mix{k}")(joined)
        h2 = keras.layers.Dense(8, activation="sigmoid", name=f"side{k}")(h2)
    out1 = keras.layers.Dense(3, activation="softmax", name="out1")(h1)
    out2 = keras.layers.Dense(1, name="out2")(keras.layers.Add(name="sum")([h1, h2]))
    return keras.Model([a, b], [out1, out2, aux], name="net")


def compile_(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=["categorical_crossentropy", "mse", "mse"], loss_weights=[1.0, 0.5, 0.1],
                  metrics=[["accuracy"], ["mae"], []])


rng = np.random.default_rng(3)
N = 48
x = [rng.standard_normal((N, 6)).astype("float32"), rng.standard_normal((N, 4)).astype("float32")]
y = [np.eye(3, dtype="float32")[rng.integers(0, 3, N)], rng.standard_normal((N, 1)).astype("float32"),
     rng.standard_normal((N, 1)).astype("float32")]
sample_weight = rng.uniform(0.5, 1.5, N).astype("float32")
BATCH, EPOCHS = 16, 2


class StepLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        self.trace = getattr(getattr(self.model, "runner", None), "trace", None)  # a training step's


def train(model):
    record = StepLosses()
    history = model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                        validation_data=(x, y), verbose=0, callbacks=[record])
    train.trace = record.trace
    return record.losses, history.history


def close(what, actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what} [{i}]")


serial = build(args.stages, splits=True)
compile_(serial)
serial_losses, serial_history = train(serial)
serial_weights = serial.get_weights()
serial_eval = serial.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
serial_pred = serial.predict(x, batch_size=BATCH, verbose=0)

# (schedule, defer_weight_gradients, name): 1F1B with weight gradients in each backward, deferred to one
# weight pass per step, and a weight pass every 2 micro-batches (Note [Deferred weight gradients]).
for schedule, defer, name in (("1f1b", False, "1f1b"), ("1f1b", True, "1f1b with deferred weight gradients"),
                              ("gpipe", 2, "gpipe")):
    # Through the public entry point: tnt.Model hands PIPELINING/ALL to tarantella.pipeline.
    strategy = tnt.ParallelStrategy.ALL if args.data_parallel else tnt.ParallelStrategy.PIPELINING
    model = tnt.Model(build(args.stages), parallel_strategy=strategy, num_micro_batches=4, schedule=schedule,
                      defer_weight_gradients=defer)
    placement = model.placement
    assert placement.num_stages == args.stages and placement.num_replicas == size // args.stages
    whole_layers = len(model.whole_model.layers)
    assert len(model.stage_model.layers) < whole_layers, "the stage holds the whole model"
    model.runner.record_pass_times = True  # the order checks below read the pass times, under determinism too
    compile_(model)
    losses, history = train(model)
    # The traced step ran the passes one at a time in schedule order (their timestamps say so), so the
    # stage held at most S - stage (1F1B) or M (GPipe) micro-batches' activations; deferred weight
    # gradients keep the layer inputs of the micro-batches until their weight pass (here: up to all 4).
    executed = sorted(train.trace.passes, key=lambda p: p[2])
    assert [(k, m) for k, m, _, _ in executed] == [tuple(p) for p in train.trace.schedule], executed
    assert all(a[3] <= b[2] for a, b in zip(executed, executed[1:])), "passes overlapped"
    live = max_live_micro_batches([Pass(k, m) for k, m, _, _ in executed])
    deferred = defer not in (None, False) and model.runner.defers_weight_gradients
    assert deferred == any(k == "weight" for k, _ in train.trace.schedule), (name, train.trace.schedule)
    assert live == (min(args.stages - placement.stage, 4) if schedule == "1f1b" and not deferred else 4), (name, live)
    close(f"{name} step losses", losses, serial_losses)
    for key in serial_history:
        close(f"{name} history {key}", history[key], serial_history[key])
    close(f"{name} weights", model.get_weights(), serial_weights)
    print(f"OK {name} training matches serial", flush=True)
    result = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert result.keys() == serial_eval.keys(), (result, serial_eval)
    close(f"{name} evaluate", [result[k] for k in sorted(result)], [serial_eval[k] for k in sorted(result)])
    prediction = model.predict(x, batch_size=BATCH, verbose=0)
    close(f"{name} predict", prediction, serial_pred)
    print(f"OK {name} evaluate and predict match serial", flush=True)

if args.save:
    path = os.path.join(args.save, "whole.keras")
    model.save(path)
    if rank == 0:
        loaded = keras.saving.load_model(path)
        assert [w.shape for w in loaded.get_weights()] == [w.shape for w in serial_weights]
        close("saved weights", loaded.get_weights(), serial_weights)
        close("saved model predicts", loaded.predict(x, verbose=0), serial_pred)
    tnt.barrier()
    again = load_model(path, num_micro_batches=2, schedule="gpipe", data_parallel=args.data_parallel)
    close("reloaded pipelined predict", again.predict(x, batch_size=BATCH, verbose=0), serial_pred)
    print("OK save writes one keras file; load_model pipelines it", flush=True)
print("OK done", flush=True)
