"""What a stage's compute costs when the batch is cut into micro-batches, on one thread: the ceiling of a
pipeline's throughput at small micro-batches (issue 20 §3).

    python -m bench.pipeline.micro_batch_cost [--width 2048] [--layers 4] [--batch 128] [--micro-batches 8]

Runs the forward and backward passes of `--layers` Dense(width) layers (a stage of the 8-layer benchmark
MLP at 2 stages) over `--batch` rows, once as one batch and once as `--micro-batches` micro-batches whose
weight gradients are summed, in one tf.function each, and prints the medians of 7 timed calls and their
ratio. Each micro-batch reads every weight again in its forward and input-gradient passes and writes a
full-size weight gradient, so at few rows per micro-batch the passes are bound by memory, not arithmetic:
a ratio r caps a pipeline of S stages at M micro-batches to S * M / (M + S - 1) / r x serial's compute.
A third timing runs the micro-batches as a pipeline stage does with deferred weight gradients (the default
of 1F1B at these sizes): the same Keras Dense layers under weight_gradients.DeferredDense, each micro-batch's
backward giving only its input gradient, one weight pass over all rows after the last.
"""
import argparse
import os
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tarantella.pipelining.weight_gradients import DeferredDense  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--micro-batches", type=int, default=8)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ["TF_NUM_INTRAOP_THREADS"]))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["TF_NUM_INTEROP_THREADS"]))
    weights = [tf.Variable(np.random.default_rng(i).standard_normal((args.width, args.width)).astype("float32")
                           * 0.01) for i in range(args.layers)]

    @tf.function
    def passes(x, parts):
        sums = [tf.zeros_like(w) for w in weights]
        for rows in tf.split(x, parts):
            with tf.GradientTape() as tape:
                h = rows
                for w in weights:
                    h = tf.nn.relu(h @ w)
                loss = tf.reduce_sum(h)
            sums = [s + g for s, g in zip(sums, tape.gradient(loss, weights))]
        return sums

    stage = keras.Sequential([keras.Input((args.width,))] + [keras.layers.Dense(args.width, activation="relu",
                                                                                 use_bias=False)
                                                              for _ in range(args.layers)])
    for layer, w in zip(stage.layers, weights):
        layer.kernel.assign(w)

    @tf.function
    def deferred_passes(x, parts):
        layers = DeferredDense(stage, stage.trainable_variables)
        for rows in tf.split(x, parts):
            with tf.GradientTape() as tape:
                tape.watch(rows)
                with layers.recording():
                    loss = tf.reduce_sum(stage(rows))
            tape.gradient(loss, rows)
        return layers.weight_pass([None] * len(stage.trainable_variables))

    x = tf.random.normal((args.batch, args.width))
    medians = {}
    for name, function, parts in (("1 micro-batch", passes, 1),
                                  (f"{args.micro_batches} micro-batches", passes, args.micro_batches),
                                  (f"{args.micro_batches} micro-batches, weight gradients deferred", deferred_passes,
                                   args.micro_batches)):
        function(x, parts)  # trace
        times = []
        for _ in range(7):
            began = time.perf_counter()
            function(x, parts)
            times.append(time.perf_counter() - began)
        medians[name] = float(np.median(times))
        print(f"{args.layers} x Dense({args.width}), {args.batch} rows in {name}: {1e3 * medians[name]:.1f} ms "
              f"(ratio {medians[name] / medians['1 micro-batch']:.2f})", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
