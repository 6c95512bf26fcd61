"""Facts of this machine for its cluster profile, measured by one process.

`tnt-bench calibrate` measures what a 1-rank run can tell, so that a prediction of 2 and
4 ranks from the profile is out of sample (no multi-rank run informs it):
    memory   copy bandwidth of one core (one thread) and of the node (one thread per
             core, each copying its own arrays), bytes read + written per second
    tcp      (--tcp) the kernel's TCP path between two threads of this process over the
             loopback: half the round trip of 1 byte, and the rate of 1 MiB sends; the
             namespace cluster's hosts talk TCP through veth links and a bridge, the same
             kernel path plus the bridge
The compute figures come from the 1-device model profile (profile.json); latencies of
the shared-memory path are not measurable by one process and are stated in the profile.

`tnt-bench calibrate -n 2` still fits the shared-memory allreduce to a 2-rank probe
(bench/programs/link_probe.py); a profile fitted that way predicts 2 ranks in sample.
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import time

import numpy as np

__all__ = ["measure_memory_bandwidth", "memory_fragment", "measure_tcp_loopback", "tcp_fragment", "fit_shared_memory_link", "profile_fragment",
           "run_calibration"]

_SLOT_BYTES = 1 << 20


def _copy_rate(threads: int, nbytes: int, repeats: int) -> float:
    pairs = [(np.ones(nbytes // 8), np.empty(nbytes // 8)) for _ in range(threads)]

    def copy(pair):
        np.copyto(pair[1], pair[0])

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(copy, pairs))                       # touch the pages first
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(copy, pairs))
            times.append(time.perf_counter() - start)
    return 2.0 * nbytes * threads / float(np.median(times))


def measure_memory_bandwidth(nbytes: int = 256 << 20, repeats: int = 5, cores: int | None = None) -> dict:
    """Copy bandwidth (read + write, bytes/s) of one thread and of one thread per core."""
    cores = cores or len(os.sched_getaffinity(0))
    return {"core_Bps": _copy_rate(1, nbytes, repeats), "node_Bps": _copy_rate(cores, nbytes, repeats),
            "cores": cores, "bytes": nbytes, "repeats": repeats}


def memory_fragment(measured: dict) -> str:
    return (f"[memory]   # tnt-bench calibrate: numpy copies of {measured['bytes'] >> 20} MiB, median of "
            f"{measured['repeats']}\n"
            f"node_bandwidth_GBps = {measured['node_Bps'] / 1e9:.2f}   # {measured['cores']} threads\n"
            f"core_bandwidth_GBps = {measured['core_Bps'] / 1e9:.2f}   # 1 thread\n")


def measure_tcp_loopback(nbytes: int = 256 << 20, pings: int = 2000) -> dict:
    """Latency (half round trip, median) and bandwidth of TCP over the loopback, one process."""
    import socket
    import threading
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    for end in (client, server):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def echo(count):
        for _ in range(count):
            server.sendall(server.recv(1))

    thread = threading.Thread(target=echo, args=(pings,))
    thread.start()
    trips = []
    for _ in range(pings):
        start = time.perf_counter()
        client.sendall(b"x")
        client.recv(1)
        trips.append(time.perf_counter() - start)
    thread.join()
    chunk = b"\0" * (1 << 20)
    received = [0]

    def drain():
        while received[0] < nbytes:
            received[0] += len(server.recv(1 << 20))

    thread = threading.Thread(target=drain)
    start = time.perf_counter()
    thread.start()
    for _ in range(nbytes // len(chunk)):
        client.sendall(chunk)
    thread.join()
    seconds = time.perf_counter() - start
    for end in (client, server, listener):
        end.close()
    return {"latency_s": float(np.median(trips)) / 2, "bandwidth_Bps": nbytes / seconds, "bytes": nbytes,
            "pings": pings}


def tcp_fragment(measured: dict) -> str:
    return (f"[inter_node]   # tnt-bench calibrate --tcp: loopback TCP, {measured['pings']} pings, "
            f"{measured['bytes'] >> 20} MiB\n"
            f"latency_us = {measured['latency_s'] * 1e6:.1f}   # half round trip, median\n"
            f"bandwidth_GBps = {measured['bandwidth_Bps'] / 1e9:.2f}   # 1 MiB sends\n")


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


def run_calibration(devices: int, max_bytes: int, tcp: bool = False) -> str:
    """1 device: the memory (and TCP) probes in this process; more: the allreduce probe on `devices` ranks."""
    if devices == 1:
        text = memory_fragment(measure_memory_bandwidth())
        return text + ("\n" + tcp_fragment(measure_tcp_loopback()) if tcp else "")
    import subprocess
    import sys
    from bench.programs.result_line import parse_result_line
    program = __file__.replace("simulate/calibrate.py", "programs/link_probe.py")
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "-n", str(devices), "--", program,
                           "--algorithm", "shared_memory", "--max-bytes", str(max_bytes)],
                          capture_output=True, text=True, timeout=600)
    result = parse_result_line(done.stdout)
    if done.returncode or result is None:
        raise RuntimeError(f"the allreduce probe failed (exit code {done.returncode}): {done.stderr[-2000:]}")
    fit = fit_shared_memory_link(result["sizes_bytes"], result["times_s"], devices)
    lines = [f"# {s:>10} bytes: {t * 1e6:10.1f} us" for s, t in zip(result["sizes_bytes"], result["times_s"])]
    return "\n".join([f"# shared-memory allreduce on {devices} ranks, median of 10 (in sample for "
                      f"{devices}-rank predictions)", *lines, "", profile_fragment(fit)])
