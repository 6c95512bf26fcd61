"""Run the pipeline benchmarks through the launcher and write results/pipeline/.

    python -m bench.pipeline.sweep [--out results/pipeline] [--steps 32] [--batch 128] [--repeats 3]
                                   [--micro-batches 1,2,4,8] [--budget-mib 256] [--big-width 2048]
                                   [--models mlp,over_budget] [--no-deferred-1f1b]

Two models (bench/pipeline/program.py): the 8 x Dense(512) MLP, and the same
chain at `--big-width`, whose parameters plus Adam state exceed
`--budget-mib` per rank while half of it (one stage) fits. For each: serial
(1 rank), 2-rank data parallelism, and 2-stage GPipe and 1F1B at each M (each
with its default for deferred weight gradients, and 1F1B deferring them too);
every configuration `--repeats` times, reporting medians of the steady-state
throughput (`samples_per_s`; `samples_per_s_fit` over the whole `fit`, see
program.py). `--batch` is the global batch (micro-batches of batch / M). Each
rank runs on a core of its own (program.py --pin; `--no-pin` to let them float),
so serial is the whole model on one core. The big model's
serial and data-parallel rows report that they do not fit the budget.

Writes runs.jsonl (every run: machine, commit, options, raw per-rank
statistics incl. the load average before and after), runs.csv (the medians)
and summary.md (the table, with the bubble against (S-1)/(M+S-1) and the
throughput against the ideal S*M/(M+S-1) x serial).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

from bench.machine import describe_machine, describe_source

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLUMNS = ["model", "mode", "schedule", "defer_weight_gradients", "micro_batches", "ranks", "global_batch", "fits", "samples_per_s",
           "samples_per_s_fit", "speedup_vs_serial",
           "ideal_speedup", "fraction_of_ideal", "bubble_fraction", "ideal_bubble_fraction", "live_peak_per_stage",
           "max_rank_params_fraction", "max_rank_state_mib", "budget_mib", "within_budget",
           "max_rank_peak_rss_growth_mib", "loadavg_1min_max"]


# (schedule, defer_weight_gradients): each schedule's default (GPipe defers its weight gradients to one
# weight pass per step, 1F1B does not), and 1F1B deferring them too (it then holds the layer inputs of every
# micro-batch until the weight pass; Note [Deferred weight gradients] in tarantella/pipelining/weight_gradients.py).
PIPELINES = [("gpipe", "default"), ("1f1b", "default"), ("1f1b", "on")]


def launch(ranks: int, options: list[str], timeout: float = 600, env: dict | None = None, program: str = PROGRAM,
           launcher_args: tuple = ()) -> subprocess.CompletedProcess:
    """`tarantella -n ranks [launcher_args] -- program options` (otherwise the launcher's defaults), run to its end."""
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), *launcher_args, "--", program, *options]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def result_of(stdout: str) -> dict | None:
    """The JSON of a program's RESULT line, or None."""
    for line in stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    return None


def run(ranks: int, options: list[str], timeout: float = 600, env: dict | None = None,
        program: str = PROGRAM) -> dict:
    """`tarantella -n ranks -- program options` (the launcher's defaults); the RESULT line's JSON."""
    done = launch(ranks, options, timeout, env, program)
    result = result_of(done.stdout)
    if result is None:
        raise RuntimeError(f"no result from {' '.join(done.args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return result


def plan(options) -> list[tuple[str, int, list[str]]]:
    models = [("mlp", ["--width", "512"]),
              ("over_budget", ["--width", str(options.big_width), "--budget-mib", str(options.budget_mib)])]
    models = [m for m in models if m[0] in options.models.split(",")]
    rows = []
    for name, model in models:
        rows += [(name, 1, ["--mode", "serial"] + model), (name, 2, ["--mode", "data"] + model)]
        for schedule, defer in PIPELINES:
            if defer == "on" and options.no_deferred_1f1b:
                continue
            for m in options.micro_batches.split(","):
                rows.append((name, 2, ["--mode", "pipeline", "--schedule", schedule, "--micro-batches", m,
                                       "--defer", defer] + model))
    return rows


def median_row(name: str, runs: list[dict], serial: dict | None) -> dict:
    first = runs[0]
    row = {"model": name, "mode": first["mode"], "schedule": first["schedule"],
           "defer_weight_gradients": first.get("defer_weight_gradients"),
           "micro_batches": first["micro_batches"], "ranks": first["ranks"], "global_batch": first["global_batch"],
           "fits": first["fits"],
           "budget_mib": first["budget_mib"]}
    loads = [max(r["loadavg_before"][0], r["loadavg_after"][0]) for run in runs for r in run["per_rank"]]
    row["loadavg_1min_max"] = round(max(loads), 2)
    if not first["fits"]:
        row["max_rank_state_mib"] = round(first["needed_bytes"] / 2**20, 1)
        row["within_budget"] = False
        return row
    speed = statistics.median(r["samples_per_s"] for r in runs)
    row["samples_per_s"] = round(speed, 1)
    row["samples_per_s_fit"] = round(statistics.median(r["samples_per_s_fit"] for r in runs), 1)
    if serial and serial.get("samples_per_s"):
        row["speedup_vs_serial"] = round(speed / serial["samples_per_s"], 3)
    if first["mode"] == "pipeline":
        S, M = first["ranks"], first["micro_batches"]
        row["ideal_speedup"] = round(S * M / (M + S - 1), 3)
        if "speedup_vs_serial" in row:
            row["fraction_of_ideal"] = round(row["speedup_vs_serial"] / row["ideal_speedup"], 3)
        row["bubble_fraction"] = round(statistics.median(r["bubble_fraction"] for r in runs), 4)
        row["ideal_bubble_fraction"] = round(first["ideal_bubble_fraction"], 4)
        row["live_peak_per_stage"] = first["live_peak_per_stage"]
    row["max_rank_params_fraction"] = round(statistics.median(r["max_rank_params_fraction"] for r in runs), 3)
    state = max(p["params_bytes"] + p["optimizer_bytes"] for p in first["per_rank"])
    row["max_rank_state_mib"] = round(state / 2**20, 1)
    if first["budget_mib"] is not None:
        row["within_budget"] = all(r.get("within_budget") for r in runs)
    row["max_rank_peak_rss_growth_mib"] = round(statistics.median(
        max(p["peak_rss_mib"] - p["rss_before_mib"] for p in r["per_rank"]) for r in runs), 1)
    return row


def write_summary(path: str, rows: list[dict], context: dict) -> None:
    lines = ["# Pipeline benchmark (bench/pipeline/sweep.py)", "",
             f"Machine: {json.dumps(context['machine'])}", f"Source: {json.dumps(context['source'])}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in COLUMNS) + " |")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(REPO, "results", "pipeline"))
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batches", default="1,2,4,8")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--budget-mib", type=float, default=256.0)
    parser.add_argument("--big-width", type=int, default=2048)
    parser.add_argument("--models", default="mlp,over_budget", help="which of mlp,over_budget to run")
    parser.add_argument("--no-deferred-1f1b", action="store_true",
                        help="leave out the rows of 1F1B with deferred weight gradients (--defer on)")
    parser.add_argument("--no-pin", action="store_true",
                        help="let ranks float over all cores (default: each rank on a core of its own, program.py --pin)")
    options = parser.parse_args()
    common = ["--steps", str(options.steps), "--batch", str(options.batch), "--layers", str(options.layers)]
    common += [] if options.no_pin else ["--pin"]
    os.makedirs(options.out, exist_ok=True)
    context = {"machine": describe_machine(), "source": describe_source()}
    raw, rows, serial = [], [], {}
    for name, ranks, args in plan(options):
        runs = []
        for repeat in range(options.repeats):
            result = run(ranks, args + common)
            result.update(context, model=name, repeat=repeat)
            runs.append(result)
            raw.append(result)
        if args[1] == "serial":
            serial[name] = {"samples_per_s": statistics.median(r["samples_per_s"] for r in runs)} \
                if runs[0]["fits"] else None
        row = median_row(name, runs, serial.get(name))
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(options.out, "runs.jsonl"), "w") as handle:
        for result in raw:
            handle.write(json.dumps(result) + "\n")
    with open(os.path.join(options.out, "runs.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in COLUMNS})
    write_summary(os.path.join(options.out, "summary.md"), rows, context)
    print(f"wrote {options.out}/runs.jsonl, runs.csv and summary.md", flush=True)


if __name__ == "__main__":
    main()
