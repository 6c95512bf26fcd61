"""Issue 21 §3: weights held, optimizer state, gradient memory, peak memory and step time per rank, sharded (ZeRO
stages 1-3) against plain data parallelism, side by side in one run; writes results/sharding/.

    python -m bench.sharding.memory [--model mlp|transformer] [--out results/sharding/MODEL-DEPTHxWIDTH]
                                    [--ranks 1,2,4] [--repeats 1] [--width 4096 --depth 6 --batch 64 --steps 6]

Per rank count, `tarantella -n N` (the launcher's defaults) runs bench/sharding/program.py unsharded and with
shard="optimizer", "gradients" and "weights", alternating within each repeat; rows are medians over the repeats, of the
largest rank's figures (program.py says what each one measures). Ratios are to the unsharded run at the same
rank count.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from bench.machine import describe_machine, describe_source
from bench.pipeline.sweep import REPO, run
from bench.sharding.model_options import add_model_options, program_arguments
from bench.records import write_raw_and_table

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
MODES = ("off", "optimizer", "gradients", "weights")
FIGURES = ("weights_held", "optimizer_state", "gradient_memory")


def row_of(results: list[dict]) -> dict:
    first = results[0]

    def largest(key):
        return statistics.median(max(rank[key] for rank in r["per_rank"]) for r in results)

    loads = [max(rank["loadavg_before"][0], rank["loadavg_after"][0]) for r in results for rank in r["per_rank"]]
    return {"shard": first["shard"], "ranks": first["ranks"], "params": first["params"],
            "weights_mib": round(first["weights_mib"], 1), "global_batch": first["global_batch"],
            "weights_held_mib": round(largest("weights_held_mib"), 1),
            "optimizer_state_mib": round(largest("optimizer_state_mib"), 1),
            "gradient_memory_mib": round(largest("gradient_memory_mib"), 1),
            "peak_rss_growth_mib": round(largest("peak_rss_growth_mib"), 1),
            "step_s": round(largest("step_s"), 3), "repeats": len(results), "loadavg_1min_max": round(max(loads), 2)}


def table(rows: list[dict]) -> str:
    lines = ["| ranks | shard | weights held per rank (MiB) | of unsharded | optimizer state per rank (MiB) | "
             "of unsharded | gradient memory per rank (MiB) | "
             "of unsharded | peak RSS growth per rank (MiB) | of unsharded | step (s) | of unsharded | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['ranks']} | {row['shard']} | {row['weights_held_mib']} | "
                     f"{row.get('weights_held_of_unsharded', '')} | {row['optimizer_state_mib']} | "
                     f"{row.get('optimizer_state_of_unsharded', '')} | {row['gradient_memory_mib']} | "
                     f"{row.get('gradient_memory_of_unsharded', '')} | {row['peak_rss_growth_mib']} | "
                     f"{row.get('peak_rss_of_unsharded', '')} | {row['step_s']} | {row.get('step_of_unsharded', '')} | "
                     f"{row['loadavg_1min_max']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="default: results/sharding/<model>-<depth>x<width>")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=1)
    add_model_options(parser, depth=6)
    options = parser.parse_args()
    options.out = options.out or os.path.join(REPO, "results", "sharding",
                                              f"{options.model}-{options.depth}x{options.width}")
    os.makedirs(options.out, exist_ok=True)
    context = {"machine": describe_machine(), "source": describe_source()}
    model = program_arguments(options)
    raw, rows = [], []
    for ranks in map(int, options.ranks.split(",")):
        results = {mode: [] for mode in MODES}
        for repeat in range(options.repeats):
            for mode in MODES:
                result = run(ranks, ["--shard", mode] + model, timeout=1800, program=PROGRAM)
                result.update(context, repeat=repeat)
                results[mode].append(result)
                raw.append(result)
        unsharded = row_of(results["off"])
        for mode in MODES:
            row = row_of(results[mode])
            if mode != "off":
                for figure in FIGURES:
                    row[f"{figure}_of_unsharded"] = round(row[f"{figure}_mib"] / unsharded[f"{figure}_mib"], 3)
                row["peak_rss_of_unsharded"] = round(row["peak_rss_growth_mib"] / unsharded["peak_rss_growth_mib"], 3)
                row["step_of_unsharded"] = round(row["step_s"] / unsharded["step_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    params = raw[0]["params"] if raw else 0
    write_raw_and_table(options.out, raw, context, table(rows),
                        f"Model: {options.model}, depth {options.depth}, width {options.width} ({params / 1e6:.1f} M "
                        f"parameters; bench/sharding/program.py), Adam, global batch {options.batch}, {options.steps} "
                        f"steps; `python -m bench.sharding.memory --model {options.model} --depth {options.depth} "
                        f"--width {options.width} --batch {options.batch}`\n\n")
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
