"""Issue 21 §3: a model that does not fit a per-rank memory budget with plain data parallelism trains sharded.

    python -m bench.sharding.fits [--budget 4GiB] [--ranks 2] [--model mlp --depth 8 --width 4096 --batch 64]

Runs bench/sharding/program.py through `tarantella -n N --memory-budget B` (the launcher's budget, enforced on
each rank's peak resident memory from the start of the process: Note [The per-rank memory budget] in
tarantella/memory_budget.py), unsharded and with shard="optimizer", "gradients" and "weights", and records for
each whether it trained, the budget's error line if it did not, and the peak it reached. Writes
results/sharding/fits-MODEL/.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from bench.machine import describe_machine, describe_source
from bench.pipeline.sweep import REPO, launch, result_of
from bench.records import write_raw_and_table
from bench.sharding.model_options import add_model_options, program_arguments

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
MODES = ("off", "optimizer", "gradients", "weights")
BUDGET_EXIT_CODE = 3  # memory_budget.start's


def attempt(ranks: int, budget: str, mode: str, model: list[str], timeout: float) -> dict:
    began = time.monotonic()
    done = launch(ranks, ["--shard", mode, *model], timeout, program=PROGRAM, launcher_args=("--memory-budget", budget))
    result = result_of(done.stdout)
    refusal = next((line.strip() for line in done.stderr.splitlines() if "MemoryBudgetError" in line), "")
    return {"shard": mode, "ranks": ranks, "budget": budget, "exit_code": done.returncode,
            "trained": done.returncode == 0 and result is not None, "budget_error": refusal,
            "seconds": round(time.monotonic() - began, 1), "result": result}


def table(rows: list[dict]) -> str:
    lines = ["| ranks | shard | budget | trained | peak RSS growth of the largest rank (MiB) | what stopped it |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        peak = (round(max(rank["peak_rss_growth_mib"] for rank in row["result"]["per_rank"]), 1)
                if row["result"] else "")
        stopped = row["budget_error"] or ("" if row["trained"] else f"exit code {row['exit_code']}" + (
            " (the budget's: its line was lost when the job was aborted)" if row["exit_code"] == BUDGET_EXIT_CODE
            else ""))
        lines.append(f"| {row['ranks']} | {row['shard']} | {row['budget']} | {'yes' if row['trained'] else 'no'} | "
                     f"{peak} | {stopped} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="4GiB", help="each rank's peak resident memory budget")
    parser.add_argument("--ranks", default="2")
    add_model_options(parser, depth=8)
    parser.add_argument("--out", default=None, help="default: results/sharding/fits-<model>-<depth>x<width>")
    options = parser.parse_args()
    options.out = options.out or os.path.join(REPO, "results", "sharding",
                                              f"fits-{options.model}-{options.depth}x{options.width}")
    os.makedirs(options.out, exist_ok=True)
    context = {"machine": describe_machine(), "source": describe_source()}
    model = program_arguments(options)
    rows = []
    for ranks in map(int, options.ranks.split(",")):
        for mode in MODES:
            row = attempt(ranks, options.budget, mode, model, timeout=1800)
            row.update(context)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("result", "machine", "source")}),
                  flush=True)
    write_raw_and_table(options.out, rows, context, table(rows),
                        f"Model: {options.model}, depth {options.depth}, width {options.width} (bench/sharding/"
                        f"program.py), Adam, global batch {options.batch}, {options.steps} steps, per-rank budget "
                        f"{options.budget} on the whole process's peak resident memory; `python -m "
                        f"bench.sharding.fits --budget {options.budget} --ranks {options.ranks} --model "
                        f"{options.model} --depth {options.depth} --width {options.width} --batch "
                        f"{options.batch}`\n\n")
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
