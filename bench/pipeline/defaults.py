"""Issue 20 §3-§4: pipelining as a user launches it, against serial one-thread Keras; writes
results/pipeline_defaults/.

    python -m bench.pipeline.defaults [--out results/pipeline_defaults] [--repeats 3] [--widths 512,2048]
                                      [--batches 128,1024]

Per model (8 x Dense(W), Adam) and global batch: serial on one TensorFlow thread (`tarantella -n 1` with
TF_NUM_INTRAOP_THREADS=TF_NUM_INTEROP_THREADS=1), Keras's own and with the one-pass Adam update that
pipelines take (tarantella/step/adam_in_one_pass.py: the same bits, fewer passes over memory; the second
ratio to the ideal is against it, like for like), and a 2-stage 1F1B pipeline at M = 8 launched with
`tarantella -n 2` and nothing else (the launcher's defaults: each rank its share of the threads and
cores; program.py --launcher-threads), its model built in `tnt.deferred_weights()`, with weight
gradients per backward and deferred to one weight pass per step (1F1B's default picks one: weight_gradients.defer_by_default). The
configurations alternate within each repeat (A/B/C, A/B/C, ...), so drift in the machine's speed touches
all alike; rows are medians over the repeats.

Reported per row: steady-state samples/s and its fraction of the ideal S M / (M + S - 1) x serial, and the
peak resident memory growth of the largest rank from before the model is built (VmHWM, its mark reset then),
and its ratio to serial's.
"""
from __future__ import annotations

import argparse
import json
import os

from bench.machine import describe_machine, describe_source
from bench.pipeline.sweep import REPO, median_row, run
from bench.records import write_raw_and_table

SERIAL_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def configurations(width: int, batch: int) -> list[tuple[str, int, list[str], dict | None]]:
    # Steps for a steady state of seconds: 95 at Dense(512)/128 (a serial step of tens of ms), 20 elsewhere.
    steps = str(max(20, min(200, (25_000_000 * 128) // (width * width * batch))))
    model = ["--width", str(width), "--batch", str(batch), "--steps", steps, "--launcher-threads"]
    pipeline = ["--mode", "pipeline", "--micro-batches", "8", "--schedule", "1f1b", "--deferred"] + model
    return [("serial", 1, ["--mode", "serial"] + model, SERIAL_ENV),
            ("serial, Adam in one pass", 1, ["--mode", "serial", "--adam-in-one-pass"] + model, SERIAL_ENV),
            ("1F1B, weight gradients per backward", 2, pipeline + ["--defer", "off"], None),
            ("1F1B, weight gradients deferred", 2, pipeline + ["--defer", "on"], None)]


def table(rows: list[dict]) -> str:
    lines = ["| model | global batch | run | samples/s | of ideal | of ideal, serial's Adam in one pass | "
             "peak RSS growth (MiB) | of serial | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| 8 x Dense({row['width']}) | {row['global_batch']} | {row['run']} | {row['samples_per_s']} | "
                     f"{row.get('fraction_of_ideal', '')} | {row.get('fraction_of_ideal_one_pass_serial', '')} | "
                     f"{row['max_rank_peak_rss_growth_mib']} | "
                     f"{row.get('memory_of_serial', '')} | {row['loadavg_1min_max']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(REPO, "results", "pipeline_defaults"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--widths", default="512,2048")
    parser.add_argument("--batches", default="128,1024")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    context = {"machine": describe_machine(), "source": describe_source()}
    raw, rows = [], []
    for width in map(int, options.widths.split(",")):
        for batch in map(int, options.batches.split(",")):
            runs = {name: [] for name, *_ in configurations(width, batch)}
            for repeat in range(options.repeats):
                for name, ranks, args, env in configurations(width, batch):
                    result = run(ranks, args, env=env)
                    result.update(context, run=name, repeat=repeat)
                    runs[name].append(result)
                    raw.append(result)
            serial = one_pass_serial = None   # the rows of the first two configurations
            for name, results in runs.items():
                row = median_row(f"8 x Dense({width})", results, serial)
                if serial is None:
                    serial = row
                elif one_pass_serial is None:
                    one_pass_serial = row
                elif "ideal_speedup" in row:
                    row["fraction_of_ideal_one_pass_serial"] = round(
                        row["samples_per_s"] / (row["ideal_speedup"] * one_pass_serial["samples_per_s"]), 3)
                row.update(run=name, width=width)
                row["memory_of_serial"] = round(row["max_rank_peak_rss_growth_mib"]
                                                / serial["max_rank_peak_rss_growth_mib"], 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_raw_and_table(options.out, raw, context, table(rows))
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
