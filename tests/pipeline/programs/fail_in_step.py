"""One op fails in the second training step of a pipelined (or data-parallel) model, on one stage, at one
point of the schedule; the job must end at once (issue 20 §2), which the test times from outside.

    fail_in_step.py POINT STAGE --stages S [--replicas R] [--schedule 1f1b|gpipe]

POINT, where the failing op sits (each is a real op failing inside the compiled step):
  before_send            the tensor of the stage's first send of the step goes through a failing check
  between_send_and_receive
                         the stage's forward of micro-batch 1: micro-batch 0's activation has left, its
                         gradient has not come back
  weight_pass            the stage's deferred weight pass (GPipe defers weight gradients)
  optimizer_update       the stage's optimizer update
  pass_clock             under op determinism, the host-clock op that records a pass's times
  data_parallel_backward tnt.Model without pipelining: a layer's gradient op fails while other gradients'
                         allreduces are pending (STAGE and --stages are ignored; the failing rank is 1)
STAGE is first, middle or last; with replicas the failure is in replica 1's copy of the stage.
Prints "OK trained step 1" on every rank before the failing step; the failing rank then raises.
"""
import argparse
import time

import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt
from tarantella.keras.layers import SplitLayer
from tarantella.pipeline import make_pipelined_model
from tarantella.pipelining import compiled_step, weight_gradients

parser = argparse.ArgumentParser()
parser.add_argument("point")
parser.add_argument("stage", choices=["first", "middle", "last"])
parser.add_argument("--stages", type=int, default=2)
parser.add_argument("--replicas", type=int, default=1)
parser.add_argument("--schedule", default="1f1b")
args = parser.parse_args()

FAILING_STEP = 1                     # 0-based: the second step, so the first traces and runs cleanly
MESSAGE = "injected failure"
step = tf.Variable(0, dtype=tf.int64, trainable=False)   # the host advances it before each step


def failing_check():
    """An op that fails in step FAILING_STEP (a real op of the step graph, not a Python raise)."""
    return tf.debugging.Assert(step < FAILING_STEP, [MESSAGE])


class CountSteps(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        step.assign(batch)

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            print("OK trained step 1", flush=True)


def chain(stages: int):
    keras.utils.set_random_seed(3)
    x = keras.Input((8,), name="x")
    h = x
    for i in range(2 * stages):
        h = keras.layers.Dense(16, activation="tanh", name=f"d{i}")(h)
        if i % 2 == 1 and i < 2 * stages - 1:
            h = SplitLayer(name=f"split{i}")(h)
    return keras.Model(x, keras.layers.Dense(2, name="out")(h))


rng = np.random.default_rng(0)
x, y = rng.standard_normal((64, 8)).astype("float32"), rng.standard_normal((64, 2)).astype("float32")

if args.point == "data_parallel_backward":
    failing_rank = 1

    class FailingGradient(keras.layers.Layer):
        """Identity forward; its gradient op fails on the failing rank in the failing step."""

        def call(self, inputs):
            @tf.custom_gradient
            def identity(t):
                def gradient(dt):
                    if tnt.get_rank() != failing_rank:
                        return dt
                    with tf.control_dependencies([failing_check()]):
                        return tf.identity(dt)
                return tf.identity(t), gradient
            return identity(inputs)

    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(64, activation="tanh")(inputs)
    h = FailingGradient()(h)   # early in the model: late in backprop, after later layers' buckets started
    h = keras.layers.Dense(64, activation="tanh")(h)
    model = tnt.Model(keras.Model(inputs, keras.layers.Dense(2)(h)))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[CountSteps()])
    raise AssertionError("the failing step did not fail")

stage_index = {"first": 0, "middle": args.stages // 2, "last": args.stages - 1}[args.stage]
if args.stage == "middle" and args.stages < 3:
    raise SystemExit("a middle stage needs --stages 3 or more")
if args.point == "pass_clock":
    tf.config.experimental.enable_op_determinism()

model = make_pipelined_model(chain(args.stages), num_micro_batches=4, num_pipeline_stages=args.stages,
                             data_parallel=args.replicas > 1, schedule=args.schedule)
failing = model.placement.stage == stage_index and model.placement.replica == args.replicas - 1
if failing:
    print(f"failing here: stage {stage_index}, replica {model.placement.replica}", flush=True)
    if args.point == "before_send":
        send = compiled_step.StageStep._send

        def checked_send(self, tensor, stage, tag):
            with tf.control_dependencies([failing_check()]):
                tensor = tf.identity(tensor)
            return send(self, tensor, stage, tag)
        compiled_step.StageStep._send = checked_send
    elif args.point == "between_send_and_receive":
        forward = compiled_step.StageStep._forward

        def checked_forward(self, m, *rest):
            if m != 1:
                return forward(self, m, *rest)
            with tf.control_dependencies([failing_check()]):
                return forward(self, m, *rest)
        compiled_step.StageStep._forward = checked_forward
    elif args.point == "weight_pass":
        weight_pass = weight_gradients.DeferredDense.weight_pass

        def checked_weight_pass(self, gradients, update=None):
            with tf.control_dependencies([failing_check()]):
                return weight_pass(self, gradients, update)
        weight_gradients.DeferredDense.weight_pass = checked_weight_pass
    elif args.point == "pass_clock":
        clock_reads = [0]

        def failing_clock():
            def read():
                clock_reads[0] += 1
                if step.numpy() >= FAILING_STEP and clock_reads[0] % 3 == 0:
                    raise RuntimeError(MESSAGE)
                return time.time()
            return tf.py_function(read, [], tf.float64)
        compiled_step.StageStep._pass_clock = lambda self: failing_clock
    elif args.point != "optimizer_update":
        raise SystemExit(f"unknown point {args.point!r}")


class CheckedSGD(keras.optimizers.SGD):
    def update_step(self, gradient, variable, learning_rate):
        with tf.control_dependencies([failing_check()]):
            super().update_step(tf.identity(gradient), variable, learning_rate)


optimizer = CheckedSGD(0.01) if failing and args.point == "optimizer_update" else keras.optimizers.SGD(0.01)
model.compile(optimizer=optimizer, loss="mse")
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[CountSteps()])
raise AssertionError("the failing step did not fail")
