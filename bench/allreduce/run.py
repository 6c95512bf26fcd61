"""`tnt-bench allreduce`: launch the timing program at each rank count, then
write results/allreduce/{allreduce.csv,summary.json,allreduce_<p>ranks.png|svg}.

    tnt-bench allreduce [--ranks 2,4] [--sizes 4K..64M] [--seconds 0.5] [--out results/allreduce]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

from bench.allreduce import report
from bench.machine import describe_machine, describe_source

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_sizes(text: str) -> list[int]:
    if ".." in text:
        low, high = (parse_size(part) for part in text.split(".."))
        if low <= 0 or high < low:
            raise ValueError(f"size range {text!r} must run from a positive size up")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= 4
        return sizes
    return [parse_size(part) for part in text.split(",")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--sizes", default="4K..64M", help="bytes: a list (4K,1M) or a range stepping x4 (4K..64M)")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per size and implementation")
    parser.add_argument("--out", default=os.path.join("results", "allreduce"), help="output directory")


def run(args) -> int:
    try:
        sizes = parse_sizes(args.sizes)
        rank_counts = [int(part) for part in args.ranks.split(",")]
    except ValueError as error:
        print(f"tnt-bench: error: {error}", file=sys.stderr)
        return 2
    if any(count < 1 for count in rank_counts):
        print("tnt-bench: error: --ranks must be positive whole numbers", file=sys.stderr)
        return 2
    rows = []
    for ranks in rank_counts:
        command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), "--", "-m",
                   "bench.allreduce.rank_program", "--sizes", ",".join(map(str, sizes)),
                   "--seconds", str(args.seconds)]
        print(f"allreduce benchmark on {ranks} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
        finished = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=3600)
        if finished.returncode != 0:
            print(f"tnt-bench: error: the {ranks}-rank run failed with exit code {finished.returncode}",
                  file=sys.stderr)
            return 1
        for line in finished.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                row = rows[-1]
                print(f"  {ranks} ranks {row['bytes']:>9} B {row['implementation']:<24} "
                      f"{row['median_s'] * 1e6:10.1f} us", file=sys.stderr, flush=True)
    frame = report.derive(rows)
    meta = {"machine": describe_machine(), "source": describe_source(), "python": platform.python_version(),
            "mpi_library": _mpi_library(), "oversubscribed": {str(r): r > (os.cpu_count() or 1) for r in rank_counts}}
    for path in report.write(frame, meta, args.out):
        print(path)
    return 0


def _mpi_library() -> str:
    from mpi4py import MPI
    return MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tnt-bench allreduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
