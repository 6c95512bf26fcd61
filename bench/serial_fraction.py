"""How far one TensorFlow process's step scales with its cores: the serial fraction of a model's step (issue 41 §1).

    python -m bench.serial_fraction --model resnet50 --micro-batch 64 [--pairs 2] [--onednn off on]
        [--out results/serial_fraction]

Note [A process's serial fraction]
A simulated CPU rank computes on its share of a node's cores (Note [Compute of a simulated rank]), the
work divided perfectly among them. A TensorFlow process does not quite: some of the work may run on one
thread (ops too small to split, the executor between ops, Python), and the rest scales. Amdahl's law with
the step's serial fraction f would give the time on c cores from the time on one:
    T(c) = T(1) x (f + (1 - f) / c)
This module measures f on this machine from the scaling benchmark's own program at 1 rank
(bench/programs/train_benchmark.py, synthetic data), run on one core (taskset, 1 intra-op and 1
inter-op thread) and on two (2 and 2), pair by pair: S = T(1) / T(2), f = 2 / S - 1.
Two cores are all this machine has, so f is read between 1 and 2 cores; the efficiency it would give on
12 and 48 cores (a published rank's share of a SuperMUC-NG node, and the whole node) is printed beside it.
The simulator does not take f: read between 1 and 2 cores, it would make a 12-core rank 2.3x slower than
perfect division, where the original's published 4-rank point lies within 7 % of perfect division
(results/serial_fraction/README.md). With --onednn off the measurement runs without TensorFlow's oneDNN
kernels (TF_ENABLE_ONEDNN_OPTS=0), as TensorFlow before 2.9 ran by default (tensorflow/tensorflow#56697),
the original's published runs (TensorFlow 2.2) among them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench.records import write_measurement

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO_ROOT, "bench", "programs", "train_benchmark.py")


def serial_fraction(one_core_s: float, two_cores_s: float) -> float:
    """Amdahl's f from the step on one core and on two (0 when two cores are twice as fast or more)."""
    speedup = one_core_s / two_cores_s
    return min(1.0, max(0.0, 2.0 / speedup - 1.0))


def efficiency(fraction: float, cores: int) -> float:
    """Amdahl's: the speedup on `cores` cores over `cores`."""
    return 1.0 / (cores * (fraction + (1.0 - fraction) / cores))


def median_step(model: str, micro_batch: int, cores: int, onednn: bool, steps: int, warmup: int) -> dict:
    """The benchmark program at 1 rank on `cores` of this machine's cores (one thread per core)."""
    from bench.launched_run import run_launched
    from bench.programs.result_line import parse_result_line
    environ = [f"{name}={cores}"
               for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")]
    cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))[:cores])
    command = ["env", *environ, f"TF_ENABLE_ONEDNN_OPTS={int(onednn)}", "taskset", "-c", cpus, sys.executable,
               "-m", "tarantella.launcher", "-n", "1", "--", PROGRAM, "--model", model,
               "--global-batch", str(micro_batch), "--steps", str(steps), "--warmup-steps", str(warmup),
               "--data", "synthetic"]
    load = os.getloadavg()[0]
    done = run_launched(command, 3600)
    if done.returncode != 0:
        raise SystemExit(f"bench.serial_fraction: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = parse_result_line(done.stdout)
    return {"cores": cores, "onednn": onednn, "step_s": statistics.median(result["step_times_s"]),
            "step_times_s": result["step_times_s"], "load_average_1m": {"before": load, "after": os.getloadavg()[0]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serial_fraction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs (one core, two cores) per setting")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--onednn", nargs="+", choices=("on", "off"), default=["off", "on"],
                        help="without and/or with TensorFlow's oneDNN kernels")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "serial_fraction"))
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("bench.serial_fraction: needs two cores to run on; this process may use one "
                         "(run it without taskset or on a machine with two cores or more)")
    settings = []
    for setting in args.onednn:
        pairs = []
        for _ in range(args.pairs):
            pair = [median_step(args.model, args.micro_batch, cores, setting == "on", args.steps,
                                args.warmup_steps) for cores in (1, 2)]
            pairs.append({"one_core": pair[0], "two_cores": pair[1],
                          "serial_fraction": serial_fraction(pair[0]["step_s"], pair[1]["step_s"])})
            print(f"{args.model} micro-batch {args.micro_batch}, oneDNN {setting}: 1 core {pair[0]['step_s']:.2f} s, "
                  f"2 cores {pair[1]['step_s']:.2f} s a step, serial fraction {pairs[-1]['serial_fraction']:.4f}",
                  flush=True)
        fraction = statistics.median(pair["serial_fraction"] for pair in pairs)
        settings.append({"onednn": setting, "serial_fraction": fraction, "pairs": pairs,
                         "efficiency": {str(cores): round(efficiency(fraction, cores), 3)
                                        for cores in (2, 12, 24, 48)}})
        print(f"  median serial fraction {fraction:.4f}; efficiency on 12 / 48 cores (Amdahl): "
              f"{settings[-1]['efficiency']['12']:.2f} / {settings[-1]['efficiency']['48']:.2f}", flush=True)
    command = "python -m bench.serial_fraction " + " ".join(argv if argv is not None else sys.argv[1:])
    write_measurement(args.out, f"{args.model}_mb{args.micro_batch}.json", {
        "model": args.model, "micro_batch": args.micro_batch, "settings": settings, "command": command})
    return 0


if __name__ == "__main__":
    sys.exit(main())
