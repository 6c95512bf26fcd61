"""A ceiling on each rank's peak resident memory (--memory-budget, TNT_MEMORY_BUDGET).

Note [The per-rank memory budget]
A rank whose process's peak resident memory exceeds the budget ends the job, naming its rank, host, peak
and budget: the run a user sizes for a node with less memory per rank fails here, at once and clearly,
instead of being killed by the kernel's out-of-memory killer (or swapping) there. The peak is the
kernel's high-water mark of the process's resident set (VmHWM in /proc/self/status), so a spike between
two looks is not missed, only noticed up to one interval later; a thread looks every 20 ms and once more
at exit. It counts the whole process from its start (the interpreter, TensorFlow, the model, its
optimizer state, the activations), as the node's memory does. Not an address-space limit (RLIMIT_AS):
TensorFlow and MPI reserve far more address space than they touch.
"""
from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading

__all__ = ["parse_size", "peak_resident_bytes", "reset_peak_resident", "resident_bytes", "start", "MIB"]

MIB = 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": MIB, "mb": MIB, "mib": MIB,
          "g": 1024 * MIB, "gb": 1024 * MIB, "gib": 1024 * MIB, "t": 1024 ** 4, "tb": 1024 ** 4, "tib": 1024 ** 4}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
INTERVAL_SECONDS = 0.02


def parse_size(text: str) -> int:
    """'1.5GiB', '800M', '2G', '123456' (bytes) -> bytes; '' or '0' -> 0 (no budget). Powers of 1024."""
    if not text.strip():
        return 0
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size such as 1.5GiB, 800MiB or 2G (powers of 1024), got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def peak_resident_bytes() -> int:
    """The process's peak resident set so far (VmHWM)."""
    return _status_bytes("VmHWM")


def reset_peak_resident() -> int:
    """Reset the kernel's peak mark (VmHWM) to the resident memory now (Linux's /proc/self/clear_refs "5") and
    return that: a measurement from here on does not see an earlier, higher peak. OSError where the kernel has
    no such control."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return resident_bytes()


def resident_bytes() -> int:
    """The process's resident set now (VmRSS)."""
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"tarantella: /proc/self/status has no {field}; the memory budget needs Linux")


def start(budget_bytes: int, rank: int, end_job) -> None:
    """Watch this process's peak against `budget_bytes`; `end_job(code)` ends the job (MPI_Abort)."""
    if budget_bytes <= 0:
        return
    stop = threading.Event()

    def check() -> None:
        peak = peak_resident_bytes()
        if peak > budget_bytes:
            sys.stderr.write(
                f"tarantella.MemoryBudgetError: rank {rank} on host {socket.gethostname()}: peak resident "
                f"memory {peak / MIB:.0f} MiB exceeds the per-rank budget of {budget_bytes / MIB:.0f} MiB "
                f"(--memory-budget); shard its training state over the ranks (--shard gradients or weights), cut "
                f"the model into more stages, build it in tnt.deferred_weights(), or raise the budget\n")
            sys.stderr.flush()
            stop.set()
            end_job(3)
            os._exit(3)  # when the job has one rank, or end_job returns

    def watch() -> None:
        while not stop.wait(INTERVAL_SECONDS):
            check()

    threading.Thread(target=watch, name="tnt-memory-budget", daemon=True).start()
    atexit.register(lambda: None if stop.is_set() else check())
