"""`python -m bench.input`: run every mode at every rank count, write results/input/ (see bench/input/__init__.py)."""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

from bench.launched_run import LaunchTimedOut, run_launched
from tarantella._provenance import describe_machine, describe_software, describe_source

MODES = ("keras", "tnt", "replicated", "shard", "py_dataset", "py_replicated")
PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(mode: str, ranks: int, args) -> list[dict]:
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), "--output-on-all-devices", "--",
               PROGRAM, mode, str(args.samples), str(args.global_batch), str(args.epochs)]
    load = round(os.getloadavg()[0], 2)
    started = time.time()
    env_path = os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ["PYTHONPATH"] = env_path
    try:
        done = run_launched(command, args.timeout)
    except LaunchTimedOut as error:
        print(f"{mode} at {ranks} ranks: timed out after {args.timeout} s\n{error.stderr[-2000:]}", file=sys.stderr)
        return []
    if done.returncode != 0:
        print(f"{mode} at {ranks} ranks failed ({done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
        return []
    rows = []
    for line in done.stdout.splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[") else line
        if text.startswith("RESULT "):
            row = json.loads(text[len("RESULT "):])
            row.update(started=started, wall_s=round(time.time() - started, 1), load_average_1m_before=load,
                       load_average_1m_after=round(os.getloadavg()[0], 2), command=" ".join(command))
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| mode | ranks | decoded per rank per epoch (share of the epoch) | input samples/s per rank "
             "| training samples/s | epoch s |", "|---|---|---|---|---|---|"]
    for mode in MODES:
        for ranks in sorted({r["ranks"] for r in rows if r["mode"] == mode}):
            group = [r for r in rows if r["mode"] == mode and r["ranks"] == ranks]
            decoded = statistics.mean(r["decoded_per_epoch"] for r in group)
            share = statistics.mean(r["decoded_share"] for r in group)
            lines.append(f"| {mode} | {ranks} | {decoded:.0f} ({share:.2f}) | "
                         f"{statistics.mean(r['input_samples_per_s_per_rank'] for r in group):.0f} | "
                         f"{min(r['train_samples_per_s'] for r in group):.0f} | "
                         f"{max(r['epoch_s'] for r in group):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.input", description=__doc__)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--samples", type=int, default=3072)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "input"))
    args = parser.parse_args(argv)
    rows = []
    for ranks in args.ranks:
        for mode in args.modes:
            if mode == "keras" and ranks != 1:
                continue
            print(f"bench.input: {mode} at {ranks} ranks", flush=True)
            rows += run(mode, ranks, args)
    context = {"machine": describe_machine(), "software": describe_software(), "source": describe_source(),
               "options": vars(args)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "runs.json"), "w") as handle:
        json.dump({"context": context, "rows": rows}, handle, indent=1)
    fields = sorted({key for row in rows for key in row})
    with open(os.path.join(args.out, "runs.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields + ["git_commit", "git_dirty", "cpu_model"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "epoch_times_s": " ".join(f"{t:.3f}" for t in row["epoch_times_s"]),
                             "git_commit": context["source"]["git_commit"], "git_dirty": context["source"]["git_dirty"],
                             "cpu_model": context["machine"]["cpu_model"]})
    machine = context["machine"]
    with open(os.path.join(args.out, "README.md"), "w") as handle:
        handle.write(f"# Input pipelines: samples decoded per rank, and throughput\n\n"
                     f"Made by `python -m bench.input {' '.join(argv if argv is not None else sys.argv[1:])}` on "
                     f"{machine['cpu_model']} ({machine['physical_cores']} cores, load average "
                     f"{machine['load_average_1m']} at the end), commit {context['source']['git_commit'][:10]}"
                     f"{' (dirty)' if context['source']['git_dirty'] else ''}; {args.samples} synthetic JPEGs "
                     f"96x96, decode + random crop 80x80 + flip per sample, global batch {args.global_batch}, "
                     f"{args.epochs} epochs (median of the epochs after the first). What the modes are: "
                     f"bench/input/__init__.py. Rows with every epoch time: runs.csv, runs.json.\n\n"
                     f"{table(rows)}\n")
    print(table(rows))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
