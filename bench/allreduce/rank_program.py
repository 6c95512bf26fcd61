"""Runs on every rank: times each engine algorithm and mpi4py's MPI_Allreduce
on the same buffers, sizes and MPI library, interleaved so that machine noise
hits all of them alike. Rank 0 prints one JSON line per (size, implementation).

    python -m bench.allreduce.rank_program --sizes 4096,65536 --seconds 0.5
        [--layout 2x2 --link-devices tntXv0,tntXv1 --counters-pid PID]

With --link-devices (the root-namespace ends of each host's link on a
namespace cluster, in host order) rank 0 also measures the bytes and packets
each host sent over its link per allreduce (packets count the messages and
their protocol turns, which the machine's load hardly changes below 1 MiB,
unlike the times; larger messages' TCP segments vary with timing): it
reads /sys/class/net/DEV/statistics/rx_bytes and rx_packets as
the root namespace sees it, through the root directory of a process there
(/proc/PID/root/sys/..., --counters-pid, the driver: a rank's own /sys shows
only its namespace's devices), around a few calls bracketed by barriers, minus
what the barriers alone send.
"""
import argparse
import json
import os
import time

import numpy as np

import tarantella as tnt  # starts MPI with MPI_THREAD_MULTIPLE before mpi4py does

ENGINE_ALGORITHMS = ("auto", "shared_memory", "hierarchical", "ring", "recursive_doubling", "rabenseifner", "mpi")
LINK_CALLS = 3  # calls per link-bytes measurement from 1 MiB up
LINK_CALLS_SMALL = 20  # below: packets vary by a few (acknowledgements) from call to call


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per size and implementation")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    parser.add_argument("--layout", default=None, help="label of the rank layout, e.g. 2x2 (hosts x ranks)")
    parser.add_argument("--link-devices", default="", help="root-namespace link devices, one per host, in order")
    parser.add_argument("--counters-pid", type=int, default=0, help="a process in the root network namespace")
    return parser.parse_args(argv)


def timed_calls(call, repetitions):
    tnt.barrier()
    start = time.perf_counter()
    for _ in range(repetitions):
        call()
    return (time.perf_counter() - start) / repetitions


def concurrent_copy_seconds(nbytes):
    """One memcpy of nbytes on every rank at once: the memory bound's yardstick."""
    source = np.ones(nbytes // 4, np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)
    return min(timed_calls(lambda: np.copyto(target, source), 3) for _ in range(3))


class LinkCounters:
    """Bytes and packets each host sent: the receive counters of its link's root-namespace end."""

    def __init__(self, devices, pid):
        self.paths = [f"/proc/{pid}/root/sys/class/net/{device}/statistics/rx_{kind}"
                      for kind in ("bytes", "packets") for device in devices]

    def sent(self):
        """Bytes of each host, then packets of each host."""
        counts = []
        for path in self.paths:
            with open(path) as handle:
                counts.append(int(handle.read()))
        return np.array(counts, dtype=np.int64)

    def per_call(self, call, calls=LINK_CALLS):
        """Bytes, then packets, each host sent per call, less the bracketing barriers' own traffic."""
        def window(body):
            tnt.barrier()
            before = self.sent() if tnt.get_rank() == 0 else None
            body()
            tnt.barrier()
            return self.sent() - before if tnt.get_rank() == 0 else None
        idle = window(lambda: None)
        busy = window(lambda: [call() for _ in range(calls)])
        return None if busy is None else np.maximum(busy - idle, 0) / calls


def implementations(data, out, comm, mpi_sum, group):
    calls = {"mpi4py_MPI_Allreduce": lambda: comm.Allreduce(data, out, op=mpi_sum)}
    for algorithm in ENGINE_ALGORITHMS:
        if algorithm == "shared_memory" and not group.on_one_node:
            continue
        calls[f"tnt_{algorithm}"] = (lambda a=algorithm: tnt.allreduce(data, algorithm=a, out=out))
    return calls


def main(argv=None):
    args = parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = tnt.get_rank(), tnt.get_size()
    group = tnt.runtime.world_group()
    layout = args.layout or f"{size}"
    devices = [d for d in args.link_devices.split(",") if d]
    counters = LinkCounters(devices, args.counters_pid) if devices else None
    hosts = group.node_count
    for nbytes in (int(text) for text in args.sizes.split(",")):
        data = np.random.default_rng(rank).standard_normal(nbytes // 4).astype(np.float32)
        out = np.empty_like(data)
        calls = implementations(data, out, comm, MPI.SUM, group)
        # Repetitions per round from one warm call, agreed on all ranks.
        repetitions = {}
        for name, call in calls.items():
            warm = timed_calls(call, 1)
            budget = args.seconds / args.rounds
            repetitions[name] = int(tnt.allreduce(np.array([max(1, min(2000, int(budget / max(warm, 1e-7))))]),
                                                  op="min")[0])
        samples = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                samples[name].append(timed_calls(call, repetitions[name]))
        link_calls = LINK_CALLS if nbytes >= 1 << 20 else LINK_CALLS_SMALL
        link = {name: counters.per_call(call, link_calls) for name, call in calls.items()} if counters else {}
        copy_seconds = concurrent_copy_seconds(nbytes) if nbytes >= 1 << 20 else None
        if rank == 0:
            for name, times in samples.items():
                row = {"layout": layout, "ranks": size, "hosts": hosts, "bytes": nbytes, "implementation": name,
                       "median_s": float(np.median(times)), "min_s": float(np.min(times)),
                       "rounds": args.rounds, "calls_per_round": repetitions[name],
                       "auto_choice": group.choose_algorithm(nbytes), "concurrent_memcpy_s": copy_seconds,
                       "load_average_1min": os.getloadavg()[0]}
                if counters:
                    sent, packets = np.split(link[name], 2)
                    row.update(link_bytes_per_host=[float(b) for b in sent],
                               link_bytes_max_host=float(sent.max()),
                               link_bytes_minimum=2 * (hosts - 1) / hosts * nbytes,
                               link_packets_per_host=[float(p) for p in packets],
                               link_packets_max_host=float(packets.max()))
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
