"""Run the pipeline benchmarks through the launcher and write results/pipeline/.

    python -m bench.pipeline.sweep [--out results/pipeline] [--steps 8]

Writes runs.jsonl (one self-describing row per run: machine, commit, options,
raw per-rank statistics), runs.csv (the headline columns) and summary.md.
Bubble fraction: per stage, 1 - (time computing passes) / (wall time of the
schedule), averaged over the stages; it includes stage imbalance and transfer
waits, against the ideal (S-1)/(M+S-1) of equal stages and free transfers.
Peak memory: each rank's peak RSS growth from just before the model is
wrapped to the end of training, against the serial model's.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

from bench.machine import describe_machine, describe_source

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(ranks: int, options: list[str], timeout: float = 300) -> dict:
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), "--", PROGRAM, *options]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    for line in done.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"no result from {' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(REPO, "results", "pipeline"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro-batches", default="1,2,4,8")
    options = parser.parse_args()
    common = ["--steps", str(options.steps)]
    plan = [(1, ["--mode", "serial"]), (2, ["--mode", "data"])]
    for schedule in ("gpipe", "1f1b"):
        for m in options.micro_batches.split(","):
            plan.append((2, ["--mode", "pipeline", "--schedule", schedule, "--micro-batches", m]))
    os.makedirs(options.out, exist_ok=True)
    context = {"machine": describe_machine(), "source": describe_source()}
    rows = []
    for ranks, args in plan:
        result = run(ranks, args + common)
        result.update(context)
        rows.append(result)
        print(f"{' '.join(args)}: {result['samples_per_s']:.1f} samples/s"
              + (f", bubble {result['bubble_fraction']:.3f} (ideal {result['ideal_bubble_fraction']:.3f})"
                 if "bubble_fraction" in result else ""), flush=True)
    with open(os.path.join(options.out, "runs.jsonl"), "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    serial = next(r for r in rows if r["mode"] == "serial")
    serial_growth = serial["per_rank"][0]["peak_rss_mib"] - serial["per_rank"][0]["rss_before_mib"]
    with open(os.path.join(options.out, "runs.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["mode", "schedule", "micro_batches", "ranks", "samples_per_s", "bubble_fraction",
                         "ideal_bubble_fraction", "max_rank_peak_rss_growth_mib", "serial_peak_rss_growth_mib",
                         "max_rank_params", "serial_params"])
        for r in rows:
            growth = max(p["peak_rss_mib"] - p["rss_before_mib"] for p in r["per_rank"])
            writer.writerow([r["mode"], r["schedule"], r["micro_batches"], r["ranks"], f"{r['samples_per_s']:.2f}",
                             f"{r['bubble_fraction']:.4f}" if "bubble_fraction" in r else "",
                             f"{r['ideal_bubble_fraction']:.4f}" if "ideal_bubble_fraction" in r else "",
                             f"{growth:.1f}", f"{serial_growth:.1f}",
                             max(p["stage_params"] for p in r["per_rank"]), serial["per_rank"][0]["stage_params"]])
    print(f"wrote {options.out}/runs.jsonl and runs.csv", flush=True)


if __name__ == "__main__":
    main()
