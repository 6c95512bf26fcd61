"""`tnt-bench allreduce`: launch the timing program at each rank count, then
write results/allreduce/{allreduce.csv,summary.json,allreduce_<layout>.png|svg}.

    tnt-bench allreduce [--ranks 2,4] [--sizes 4K..64M] [--seconds 0.5] [--out results/allreduce]
    tnt-bench allreduce --cluster 2x2,4x1 [--ranks ''] ...   (as root: namespace hosts)

--cluster HxR,... runs each layout on a cluster of H network-namespace hosts
with R ranks each (bench/cluster, brought up and always removed again), and
adds the bytes each host sent over its link per allreduce, read from the
counters of the link's root-namespace end, against the minimum 2(H-1)/H x size
of a bandwidth-optimal allreduce, and the packets against MPI_Allreduce's (the
per-message cost, which the machine's load hardly changes below 1 MiB). Every row records the 1-minute load average:
on a machine with fewer cores than ranks the figures mean little.
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
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts on this host (default 2,4; "
                        "'' for none)")
    parser.add_argument("--cluster", default="", help="comma-separated HOSTSxRANKS layouts on namespace hosts, "
                        "e.g. 2x2,4x1 (needs root)")
    parser.add_argument("--sizes", default="4K..64M", help="bytes: a list (4K,1M) or a range stepping x4 (4K..64M)")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per size and implementation")
    parser.add_argument("--out", default=os.path.join("results", "allreduce"), help="output directory")


def parse_layouts(text: str) -> list[tuple[int, int]]:
    layouts = []
    for part in (p for p in text.split(",") if p.strip()):
        hosts, _, slots = part.strip().lower().partition("x")
        if not (hosts.isdigit() and slots.isdigit() and int(hosts) >= 1 and int(slots) >= 1):
            raise ValueError(f"cluster layout {part!r} must read HOSTSxRANKS, e.g. 2x2")
        layouts.append((int(hosts), int(slots)))
    return layouts


def run(args) -> int:
    try:
        sizes = parse_sizes(args.sizes)
        rank_counts = [int(part) for part in args.ranks.split(",") if part.strip()]
        layouts = parse_layouts(args.cluster)
    except ValueError as error:
        print(f"tnt-bench: error: {error}", file=sys.stderr)
        return 2
    if any(count < 1 for count in rank_counts):
        print("tnt-bench: error: --ranks must be positive whole numbers", file=sys.stderr)
        return 2
    rows = []
    program = ["-m", "bench.allreduce.rank_program", "--sizes", ",".join(map(str, sizes)),
               "--seconds", str(args.seconds)]
    for ranks in rank_counts:
        command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks), "--", *program]
        if not _launch(command, f"{ranks} ranks", rows, {}):
            return 1
    for hosts, slots in layouts:
        from bench.cluster.netns_cluster import create
        cluster = create(hosts, slots)
        try:
            devices = ",".join(cluster.veth(host) for host in cluster.hosts)
            command = [sys.executable, "-m", "tarantella.launcher", *cluster.launcher_args(), "-n",
                       str(hosts * slots), "--", *program, "--layout", f"{hosts}x{slots}",
                       "--link-devices", devices, "--counters-pid", str(os.getpid())]
            # MPI_Allreduce polls without yielding unless told; with more ranks than cores that starves the
            # ranks it waits for, so let it yield as the engine does (the comparison stays fair).
            env = {"OMPI_MCA_mpi_yield_when_idle": "1"} if hosts * slots > (os.cpu_count() or 1) else {}
            if not _launch(command, f"{hosts} hosts x {slots} ranks", rows, env):
                return 1
        finally:
            cluster.down()
    frame = report.derive(rows)
    meta = {"machine": describe_machine(), "source": describe_source(), "python": platform.python_version(),
            "mpi_library": _mpi_library(), "cpus": os.cpu_count(),
            "oversubscribed": {row["layout"]: row["ranks"] > (os.cpu_count() or 1) for row in rows}}
    for path in report.write(frame, meta, args.out):
        print(path)
    return 0


def _launch(command: list[str], what: str, rows: list[dict], env: dict) -> bool:
    print(f"allreduce benchmark on {what}: {' '.join(command)}", file=sys.stderr, flush=True)
    finished = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=3600, env={**os.environ, **env})
    if finished.returncode != 0:
        print(f"tnt-bench: error: the run on {what} failed with exit code {finished.returncode}", file=sys.stderr)
        return False
    for line in finished.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows.append(row)
            link = (f"  link {row['link_bytes_max_host'] / row['link_bytes_minimum']:.2f} x min"
                    if row.get("link_bytes_minimum") else "")
            print(f"  {row['layout']:>4} {row['bytes']:>9} B {row['implementation']:<24} "
                  f"{row['median_s'] * 1e6:10.1f} us{link}", file=sys.stderr, flush=True)
    return True


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
