"""What a stage's compute costs when the batch is cut into micro-batches, on one thread: the ceiling of a
pipeline's throughput at small micro-batches (issue 20 §3).

    python -m bench.pipeline.micro_batch_cost [--width 2048] [--layers 4] [--batch 128] [--micro-batches 8]

Runs the forward and backward passes of `--layers` Dense(width) layers (a stage of the 8-layer benchmark
MLP at 2 stages) over `--batch` rows, once as one batch and once as `--micro-batches` micro-batches whose
weight gradients are summed, in one tf.function each, and prints the medians of 7 timed calls and their
ratio. Each micro-batch reads every weight again in its forward and input-gradient passes and writes a
full-size weight gradient, so at few rows per micro-batch the passes are bound by memory, not arithmetic:
a ratio r caps a pipeline of S stages at M micro-batches to S * M / (M + S - 1) / r x serial's compute.
"""
import argparse
import os
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


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

    x = tf.random.normal((args.batch, args.width))
    medians = {}
    for parts in (1, args.micro_batches):
        passes(x, parts)  # trace
        times = []
        for _ in range(7):
            began = time.perf_counter()
            passes(x, parts)
            times.append(time.perf_counter() - began)
        medians[parts] = float(np.median(times))
        print(f"{args.layers} x Dense({args.width}), {args.batch} rows in {parts} micro-batch(es): "
              f"{1e3 * medians[parts]:.1f} ms", flush=True)
    print(f"ratio {medians[args.micro_batches] / medians[1]:.2f} (load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
