"""Keras's Adam against the same update in one pass (TntAdamUpdate, Note [Keras's Adam in one pass] in
csrc/tf/adam_update_op.cc), timed on one thread on a stage's variables.

    python -m bench.pipeline.adam_update [--widths 512,2048] [--rounds 3]

Per width: Keras's `Adam.apply` on the kernels and biases of 4 Dense(W) layers (a stage of the 8-layer
benchmark MLP at 2 stages), traced, with and without tarantella.step.adam_in_one_pass; each timed over
calls adding up to about a second, the two alternating within each round; prints the median over the rounds.
"""
import argparse
import contextlib
import os
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tarantella.step.adam_in_one_pass import adam_in_one_pass  # noqa: E402

LAYERS = 4


def update_of(width: int, one_pass: bool):
    rng = np.random.default_rng(width)
    variables = []
    for _ in range(LAYERS):
        variables += [keras.Variable(rng.standard_normal((width, width)).astype("float32") * 0.05),
                      keras.Variable(np.zeros(width, "float32"))]
    gradients = [tf.constant(rng.standard_normal(v.shape).astype("float32")) for v in variables]
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(variables)

    @tf.function
    def update():
        with adam_in_one_pass(optimizer) if one_pass else contextlib.nullcontext():
            optimizer.apply(gradients, variables)

    update()   # trace
    return update


def ms_per_call(update) -> float:
    began, calls = time.perf_counter(), 0
    while time.perf_counter() - began < 1.0:
        update()
        calls += 1
    return 1e3 * (time.perf_counter() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="512,2048")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ["TF_NUM_INTRAOP_THREADS"]))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["TF_NUM_INTEROP_THREADS"]))
    print(f"ms per update of {LAYERS} Dense layers' variables, medians of {args.rounds} rounds "
          f"(load average {os.getloadavg()[0]:.2f})")
    for width in map(int, args.widths.split(",")):
        updates = {"Keras's Adam": update_of(width, False), "in one pass": update_of(width, True)}
        rounds = {name: [] for name in updates}
        for _ in range(args.rounds):
            for name, update in updates.items():
                rounds[name].append(ms_per_call(update))
        keras_ms, one_pass_ms = (float(np.median(rounds[name])) for name in updates)
        print(f"Dense({width}): Keras's Adam {keras_ms:7.2f}   in one pass {one_pass_ms:7.2f}   "
              f"({keras_ms / one_pass_ms:.1f} x)", flush=True)


if __name__ == "__main__":
    main()
