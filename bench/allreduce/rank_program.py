"""Runs on every rank: times each engine algorithm and mpi4py's MPI_Allreduce
on the same buffers, sizes and MPI library, interleaved so that machine noise
hits all of them alike. Rank 0 prints one JSON line per (size, implementation).

    python -m bench.allreduce.rank_program --sizes 4096,65536 --seconds 0.5
"""
import argparse
import json
import time

import numpy as np

import tarantella as tnt  # starts MPI with MPI_THREAD_MULTIPLE before mpi4py does

ENGINE_ALGORITHMS = ("auto", "shared_memory", "ring", "recursive_doubling", "rabenseifner", "mpi")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per size and implementation")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
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


def main(argv=None):
    args = parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = tnt.get_rank(), tnt.get_size()
    for nbytes in (int(text) for text in args.sizes.split(",")):
        data = np.random.default_rng(rank).standard_normal(nbytes // 4).astype(np.float32)
        out = np.empty_like(data)
        calls = {"mpi4py_MPI_Allreduce": lambda: comm.Allreduce(data, out, op=MPI.SUM)}
        for algorithm in ENGINE_ALGORITHMS:
            calls[f"tnt_{algorithm}"] = (lambda a=algorithm: tnt.allreduce(data, algorithm=a, out=out))
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
        copy_seconds = concurrent_copy_seconds(nbytes) if nbytes >= 1 << 20 else None
        if rank == 0:
            for name, times in samples.items():
                print(json.dumps({"ranks": size, "bytes": nbytes, "implementation": name,
                                  "median_s": float(np.median(times)), "min_s": float(np.min(times)),
                                  "rounds": args.rounds, "calls_per_round": repetitions[name],
                                  "auto_choice": tnt.runtime.world_group() and _auto_choice(nbytes),
                                  "concurrent_memcpy_s": copy_seconds}), flush=True)


def _auto_choice(nbytes):
    from tarantella import _engine
    return _engine.choose_algorithm(nbytes)


if __name__ == "__main__":
    main()
