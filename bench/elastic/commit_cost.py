"""What an elastic job's commits cost (tarantella --elastic, Note [Elastic commits]).

    python -m bench.elastic.commit_cost [--repeats 5] [--pairs 3] [--out results/elastic]

1. Writing and reading a commit of the state of models of three sizes (the weights and Adam's two moments, as
   tnt.Model.fit commits them) into /dev/shm: median seconds and GB/s (tarantella/elastic/commit_store.py).
2. A fit step with a commit after every step, against the same fit without --elastic: 1 rank, an MLP of 4 x
   Dense(2048) (12.6 M parameters, 151 MB of state with Adam), batch 256, pair by pair through the launcher;
   the median step time of each and the difference (what a commit costs per step).
3. The same with the optimizer state sharded (shard="optimizer", ZeRO stage 1), 2 ranks, on one host and on two
   hosts of a namespace cluster (bench/cluster/netns_cluster.py; root): on two, each rank also sends its share to
   its peer on the other host, which keeps it as a copy (Note [A commit by name] in
   tarantella/elastic/committing.py). The copies' cost: the commit's cost on two hosts less its cost on one.
   Skipped, with the reason, where no namespace cluster can be made (--no-hosts skips it too).
Writes OUT/commit_cost.json (with machine, versions, commit and load averages) and prints the tables that
results/elastic/README.md quotes. Run it on a quiet machine: nothing else may share the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from tarantella._provenance import describe_machine, describe_software, describe_source
from tarantella.elastic import commit_store

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(REPO_ROOT, "bench", "elastic", "fit_program.py")
STATES = {"MLP 4 x Dense(2048)": 12_600_000, "ResNet-50": 25_600_000, "Transformer big": 213_000_000}


def write_and_read(parameters: int, repeats: int) -> dict:
    arrays = [np.random.default_rng(0).random(parameters, dtype=np.float32) for _ in range(3)]  # weights, m, v
    root = tempfile.mkdtemp(prefix="tnt-commit-cost-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    writes, reads = [], []
    try:
        for step in range(repeats):
            started = time.perf_counter()
            commit_store.write(root, arrays, {"fit": 0, "global_step": step, "epoch": 0, "batches_done": step})
            writes.append(time.perf_counter() - started)
            meta, path = commit_store.newest(root)
            started = time.perf_counter()
            commit_store.read_arrays(path, meta["count"])
            reads.append(time.perf_counter() - started)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    size = 3 * parameters * 4
    write, read = statistics.median(writes), statistics.median(reads)
    return {"parameters": parameters, "bytes": size, "write_s": write, "read_s": read,
            "write_GBps": size / write / 1e9, "read_GBps": size / read / 1e9}


def fit_step(elastic: bool, steps: int, ranks: int = 1, launcher_args: tuple = (), shard: str | None = None) -> dict:
    from bench.launched_run import run_launched
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), *launcher_args,
               *(["--elastic"] if elastic else []), "--", PROGRAM, "--steps", str(steps),
               *(["--shard", shard] if shard else [])]
    done = run_launched(command, 900)
    if done.returncode != 0:
        raise SystemExit(f"bench.elastic.commit_cost: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("STEPS "))
    times = json.loads(line[len("STEPS "):])
    return {"elastic": elastic, "step_s": statistics.median(times), "steps": len(times),
            "load_average_1m": os.getloadavg()[0]}


def sharded_commits(steps: int, pairs: int) -> list[dict] | None:
    """Part 3: per pair, 2 ranks sharding Adam's state, without and with --elastic, on 1 host and on 2."""
    from bench.cluster.netns_cluster import ClusterError, create
    try:
        cluster = create(hosts=2, slots=1)
    except ClusterError as error:
        print(f"\nsharded commits on two hosts: skipped ({error})")
        return None
    rows = []
    try:
        for _ in range(pairs):
            row = {}
            for where, launcher_args in (("1 host", ()), ("2 hosts", tuple(cluster.launcher_args()))):
                for elastic in (False, True):
                    run = fit_step(elastic, steps, ranks=2, launcher_args=launcher_args, shard="optimizer")
                    row[f"{where}, {'commits' if elastic else 'none'}"] = run["step_s"]
                    row["load_average_1m"] = run["load_average_1m"]
            rows.append(row)
    finally:
        cluster.down()
    print("\nshard=\"optimizer\", 2 ranks, a commit every step against none (step s):\n"
          "| pair | 1 host, none | 1 host, commits | 2 hosts, none | 2 hosts, commits | commit, 1 host | "
          "commit, 2 hosts | the copies | load |\n|---|---|---|---|---|---|---|---|---|")
    for number, row in enumerate(rows, 1):
        one = row["1 host, commits"] - row["1 host, none"]
        two = row["2 hosts, commits"] - row["2 hosts, none"]
        print(f"| {number} | {row['1 host, none']:.4f} | {row['1 host, commits']:.4f} | {row['2 hosts, none']:.4f} "
              f"| {row['2 hosts, commits']:.4f} | {one:+.4f} | {two:+.4f} | {two - one:+.4f} | "
              f"{row['load_average_1m']:.2f} |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.elastic.commit_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default=os.path.join("results", "elastic"))
    parser.add_argument("--no-hosts", action="store_true", help="skip part 3 (two hosts of a namespace cluster)")
    args = parser.parse_args(argv)
    stores = {name: write_and_read(parameters, args.repeats) for name, parameters in STATES.items()}
    print("| state (weights + Adam) | MB | write s | GB/s | read s | GB/s |\n|---|---|---|---|---|---|")
    for name, row in stores.items():
        print(f"| {name} | {row['bytes'] / 1e6:.0f} | {row['write_s']:.3f} | {row['write_GBps']:.2f} | "
              f"{row['read_s']:.3f} | {row['read_GBps']:.2f} |")
    pairs = [(fit_step(False, args.steps), fit_step(True, args.steps)) for _ in range(args.pairs)]
    print("\n| pair | step s, no commits | step s, a commit every step | commit per step s | load |\n"
          "|---|---|---|---|---|")
    for number, (plain, committed) in enumerate(pairs, 1):
        print(f"| {number} | {plain['step_s']:.4f} | {committed['step_s']:.4f} | "
              f"{committed['step_s'] - plain['step_s']:+.4f} | {committed['load_average_1m']:.2f} |")
    sharded = None if args.no_hosts else sharded_commits(args.steps, args.pairs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "commit_cost.json"), "w") as handle:
        json.dump({"machine": describe_machine(), "software": describe_software(), "source": describe_source(),
                   "stores": stores, "pairs": pairs, "sharded": sharded}, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
