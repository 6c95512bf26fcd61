"""How the input pipeline and the model share a rank's cores when the input is a large part of a step (issue 41 §1).

    python -m bench.input.shared_cores [--ranks 1 16 48 96] [--repeats 2] [--steps 6] [--out results/input_cost]

Note [Input and compute on shared cores]
On a CPU node a rank's tf.data threads decode on the cores its model computes on. Whether a step then
costs compute + input (the cores are busy with one or the other) or max(compute, input) (prefetching
decodes in the cores' idle time: a TensorFlow step does not keep every core busy) decides what a cluster
with a heavy input pipeline predicts. The scaling benchmark's program at 1 rank (resnet50_small, batch 32,
2 threads) reads the generated JPEG set as one of K ranks did under the original Tarantella's sharding
after the decode (Note [Sharding after the decode] in bench/data/jpeg_pipeline.py): it decodes K
micro-batches for each one it trains on, so the input alone grows with K and the model's work stays.
Each K is measured beside a synthetic-data run (the model alone), pair by pair; the table gives
compute, input alone (the program's Note [Input-bound] figure), the step, and where the step lies
between max(compute, input) (0) and compute + input (1).
Writes OUT/shared_cores.json with machine, versions, commit and load averages.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench.input.jpeg_cost import training_step
from bench.records import write_measurement

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def between_max_and_sum(compute_s: float, input_s: float, step_s: float) -> float:
    """Where a step lies between max(compute, input) (0) and compute + input (1)."""
    low, high = max(compute_s, input_s), compute_s + input_s
    return (step_s - low) / (high - low) if high > low else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.input.shared_cores", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 16, 48, 96],
                        help="K: the ranks whose sharding after the decode the 1-rank run reads as")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "input_cost"))
    args = parser.parse_args(argv)
    from bench.data import imagenet_like
    directory, _ = imagenet_like.ensure_set()
    rows = []
    for _ in range(args.repeats):
        for ranks in args.ranks:
            alone = training_step("synthetic", args.steps)
            read = training_step(f"jpeg:{directory}", args.steps, decode_for_ranks=ranks)
            rows.append({"decode_for_ranks": ranks, "compute_s": alone["step_s"], "step_s": read["step_s"],
                         "input_alone_s": read["input_alone_s"], "runs": [alone, read],
                         "between_max_and_sum": between_max_and_sum(alone["step_s"], read["input_alone_s"],
                                                                    read["step_s"])})
            print(f"K {ranks:3d}: model alone {alone['step_s']:.3f} s, input alone {read['input_alone_s']:.3f} s, "
                  f"step {read['step_s']:.3f} s (between max and sum: {rows[-1]['between_max_and_sum']:.2f})",
                  flush=True)
    table = ["| K | model alone | input alone | step | max(model, input) | model + input "
             "| between max (0) and sum (1) |", "|---|---|---|---|---|---|---|"]
    for ranks in args.ranks:
        mine = [row for row in rows if row["decode_for_ranks"] == ranks]
        compute = statistics.median(row["compute_s"] for row in mine)
        read = statistics.median(row["input_alone_s"] for row in mine)
        step = statistics.median(row["step_s"] for row in mine)
        table.append(f"| {ranks} | {compute:.3f} s | {read:.3f} s | {step:.3f} s | {max(compute, read):.3f} s | "
                     f"{compute + read:.3f} s | {between_max_and_sum(compute, read, step):.2f} |")
    print("\n".join(table))
    write_measurement(args.out, "shared_cores.json", {
        "rows": rows, "table": table,
        "command": "python -m bench.input.shared_cores " + " ".join(argv if argv is not None else sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
