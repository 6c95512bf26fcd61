"""The two forms of a Dense layer's input gradient, dz kernel^T (TensorFlow's own gradient of x @ kernel)
and (kernel dz^T)^T, timed on one thread at a micro-batch's rows (Note [The input gradient as kernel dz^T]
in tarantella/pipelining/weight_gradients.py).

    python -m bench.pipeline.input_gradient [--widths 512,2048] [--rows 4,8,16,32,64,128] [--rounds 3]

Per width and row count: 4 chained layers (a stage of the 8-layer benchmark MLP at 2 stages) of each form,
8 times over in one tf.function, timed 15 calls each; the forms alternate within each round; prints the
median per product over the rounds' medians.
"""
import argparse
import os
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

LAYERS, CHAIN = 4, 8
FORMS = {"dz K^T": lambda dz, kernel: tf.matmul(dz, kernel, transpose_b=True),
         "(K dz^T)^T": lambda dz, kernel: tf.transpose(tf.matmul(kernel, dz, transpose_b=True))}


def per_product_ms(form, dz, kernels) -> float:
    @tf.function
    def chain():
        g = dz
        for _ in range(CHAIN):
            for kernel in kernels:
                g = form(g, kernel)
        return g

    chain()   # trace
    times = []
    for _ in range(15):
        began = time.perf_counter()
        chain()
        times.append(time.perf_counter() - began)
    return 1e3 * float(np.median(times)) / (LAYERS * CHAIN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="512,2048")
    parser.add_argument("--rows", default="4,8,16,32,64,128")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ["TF_NUM_INTRAOP_THREADS"]))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["TF_NUM_INTEROP_THREADS"]))
    rows = [int(r) for r in args.rows.split(",")]
    print(f"ms per product, medians of {args.rounds} rounds (load average {os.getloadavg()[0]:.2f})")
    print(f"{'':24s}rows " + " ".join(f"{r:>6d}" for r in rows))
    for width in map(int, args.widths.split(",")):
        rng = np.random.default_rng(width)
        kernels = [tf.Variable(rng.standard_normal((width, width)).astype("float32") * 0.05) for _ in range(LAYERS)]
        medians = {name: [] for name in FORMS}
        for r in rows:
            dz = tf.constant(rng.standard_normal((r, width)).astype("float32"))
            rounds = {name: [] for name in FORMS}
            for _ in range(args.rounds):
                for name, form in FORMS.items():
                    rounds[name].append(per_product_ms(form, dz, kernels))
            for name in FORMS:
                medians[name].append(float(np.median(rounds[name])))
        for name in FORMS:
            print(f"Dense({width}) {name:<15s}" + " ".join(f"{m:6.3f}" for m in medians[name]), flush=True)


if __name__ == "__main__":
    main()
