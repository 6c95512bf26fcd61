"""What real ImageNet-shaped input costs on this machine, per image and beside training (issue 41 §2).

    python -m bench.input.jpeg_cost [--batches 30] [--repeats 2] [--out results/input_cost]

1. The pipeline alone (bench/data/jpeg_pipeline.py, MLPerf's ResNet-50 reference shape) over the generated
   ImageNet-like set (bench/data/imagenet_like.py), in a tf.data thread pool of 1 and of all cores, at the
   crop sizes of resnet50 (224) and resnet50_small (32): core-milliseconds per image = threads x seconds /
   images (the figure a cluster profile's [input] per_example_core_ms takes, scaled to its cores).
2. Sharing the cores with the model: the scaling benchmark's program at 1 rank (bench/programs/
   train_benchmark.py), resnet50_small, --data synthetic against --data jpeg, pair by pair: the step time
   each and the input alone (Note [Input-bound] in bench/input_bound.py).
Writes OUT/cost.json (with machine, versions, commit and load averages) and prints the tables that
results/input_cost/README.md quotes. Run it on a quiet machine: nothing else may share the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench.input_bound import seconds_per_batch
from tarantella._provenance import describe_machine, describe_software, describe_source

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(REPO_ROOT, "bench", "programs", "train_benchmark.py")
MICRO_BATCH = 32
SIZES = (224, 32)


def pipeline_alone(files: list[str], image_size: int, threads: int, batches: int) -> float:
    """Core-milliseconds per image of the pipeline in a private pool of `threads` threads."""
    import tensorflow as tf

    from bench.data import jpeg_pipeline
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    dataset = jpeg_pipeline.rank_dataset(files, 0, 1, MICRO_BATCH, image_size, seed=0).with_options(options)
    return 1000.0 * threads * seconds_per_batch(dataset, batches) / MICRO_BATCH


def training_step(data: str, steps: int, decode_for_ranks: int = 0) -> dict:
    """Median step and input alone of resnet50_small at 1 rank (bench/programs/train_benchmark.py)."""
    from bench.launched_run import run_launched
    from bench.programs.result_line import parse_result_line
    command = [sys.executable, "-m", "tarantella.launcher", "-n", "1", "--", PROGRAM, "--model", "resnet50_small",
               "--global-batch", str(MICRO_BATCH), "--steps", str(steps), "--warmup-steps", "2", "--data", data,
               "--decode-for-ranks", str(decode_for_ranks)]
    done = run_launched(command, 900)
    if done.returncode != 0:
        raise SystemExit(f"bench.input.jpeg_cost: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = parse_result_line(done.stdout)
    return {"data": data, "decode_for_ranks": decode_for_ranks, "step_s": statistics.median(result["step_times_s"]),
            "input_alone_s": result.get("input_alone_s"), "threads_per_rank": result["threads_per_rank"],
            "load_average_1m": result.get("load_average_1m")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.input.jpeg_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30, help="timed batches of 32 per pipeline measurement")
    parser.add_argument("--repeats", type=int, default=2, help="pairs of training runs (synthetic, jpeg)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "input_cost"))
    args = parser.parse_args(argv)
    from bench.data import imagenet_like, jpeg_pipeline
    directory, description = imagenet_like.ensure_set()
    files = jpeg_pipeline.train_files(directory)
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    alone = []
    for image_size in SIZES:
        for threads in sorted({1, cores}):
            measured = [pipeline_alone(files, image_size, threads, args.batches) for _ in range(args.repeats)]
            alone.append({"image_size": image_size, "threads": threads,
                          "core_ms_per_image": statistics.median(measured), "runs": measured})
            print(f"pipeline alone, crop {image_size}, {threads} thread(s): {alone[-1]['core_ms_per_image']:.2f} "
                  f"core-ms per image", flush=True)
    pairs = []
    for _ in range(args.repeats):
        pairs.append([training_step("synthetic", args.steps), training_step(f"jpeg:{directory}", args.steps)])
        print(f"resnet50_small, batch {MICRO_BATCH}, 1 rank: synthetic {pairs[-1][0]['step_s']:.3f} s, jpeg "
              f"{pairs[-1][1]['step_s']:.3f} s per step (input alone {pairs[-1][1]['input_alone_s']:.3f} s)",
              flush=True)
    record = {"set": {key: description[key] for key in ("images", "mean_bytes", "mean_pixels", "median_pixels",
                                                         "mean_quality", "imagenet_mean_bytes")},
              "micro_batch": MICRO_BATCH, "pipeline_alone": alone, "training_pairs": pairs,
              "machine": describe_machine(), "software": describe_software(), "source": describe_source(),
              "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cost.json"), "w") as handle:
        json.dump(record, handle, indent=2)
    print(f"wrote {os.path.join(args.out, 'cost.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
