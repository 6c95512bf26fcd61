"""Time the engine's allreduce at a range of sizes, for calibrating a cluster profile.

    tarantella -n 2 -- bench/programs/link_probe.py --algorithm shared_memory

Prints from the master rank one `TNT_BENCH_RESULT` line: {algorithm, ranks, sizes_bytes,
times_s} with the median time of each size (float32 sums, after one warm-up call).
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="link_probe.py")
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    import numpy as np
    import tarantella as tnt
    from bench.programs.result_line import format_result_line

    sizes, times = [], []
    nbytes = 4096
    while nbytes <= args.max_bytes:
        data = np.ones(nbytes // 4, dtype=np.float32)
        tnt.allreduce(data, algorithm=args.algorithm)
        samples = []
        for _ in range(args.repeats):
            tnt.barrier()
            start = time.perf_counter()
            tnt.allreduce(data, algorithm=args.algorithm)
            samples.append(time.perf_counter() - start)
        slowest = tnt.allgather_object(float(np.median(samples)))
        sizes.append(nbytes)
        times.append(max(slowest))
        nbytes *= 4
    if tnt.is_master_rank():
        print(format_result_line({"algorithm": args.algorithm, "ranks": tnt.get_size(),
                                  "sizes_bytes": sizes, "times_s": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
