"""Link parameters of a profile from measured allreduce times (bench/programs/link_probe.py).

The shared-memory allreduce's model (allreduce_cost.py) is linear in two unknowns once
the summation is taken to run at memory speed like the copies:
    t = latency x 3 rounds + (copied + summed bytes) / bandwidth
so a least-squares fit over the probed sizes gives [intra_node] and [reduce].
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["fit_shared_memory_link", "profile_fragment"]

_SLOT_BYTES = 1 << 20


def fit_shared_memory_link(sizes: list[int], times: list[float], ranks: int) -> dict:
    rows, targets = [], []
    for nbytes, seconds in zip(sizes, times):
        rounds = max(1, math.ceil(nbytes / _SLOT_BYTES))
        moved = nbytes * (2 * (ranks - 1) / ranks + 1 / ranks) + nbytes
        # Relative error matters at every size: weight each row by 1 / t.
        rows.append([3 * rounds / seconds, moved / seconds])
        targets.append(1.0)
    (latency, inverse_bandwidth), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return {"latency_us": max(float(latency), 0.0) * 1e6,
            "bandwidth_GBps": 1.0 / max(float(inverse_bandwidth), 1e-15) / 1e9}


def profile_fragment(fit: dict) -> str:
    return (f"[intra_node]\nlatency_us = {fit['latency_us']:.2f}\n"
            f"bandwidth_GBps = {fit['bandwidth_GBps']:.2f}\n\n"
            f"[reduce]\nbandwidth_GBps = {fit['bandwidth_GBps']:.2f}\n")


def run_calibration(devices: int, max_bytes: int) -> str:
    """Probe the shared-memory allreduce on `devices` local ranks; a profile fragment."""
    import subprocess
    import sys
    from bench.programs.result_line import parse_result_line
    from bench.errors import BenchUsageError
    program = __file__.replace("simulate/calibrate.py", "programs/link_probe.py")
    if devices < 2:
        raise BenchUsageError("calibrate needs at least 2 ranks (-n 2)")
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "-n", str(devices), "--", program,
                           "--algorithm", "shared_memory", "--max-bytes", str(max_bytes)],
                          capture_output=True, text=True, timeout=600)
    result = parse_result_line(done.stdout)
    if done.returncode or result is None:
        raise RuntimeError(f"the allreduce probe failed (exit code {done.returncode}): {done.stderr[-2000:]}")
    fit = fit_shared_memory_link(result["sizes_bytes"], result["times_s"], devices)
    lines = [f"# {s:>10} bytes: {t * 1e6:10.1f} us" for s, t in zip(result["sizes_bytes"], result["times_s"])]
    return "\n".join(["# shared-memory allreduce on this machine, median of 10", *lines, "",
                      profile_fragment(fit)])
