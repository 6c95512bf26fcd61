"""A rank alone in its world while the job was started as N ranks.

When srun starts an MPI program without the process-management interface that
MPI needs (Open MPI 5 needs PMIx; Debian's srun gives it none by default, and
`--mpi=pmi2` does not help), every task comes up as rank 0 of a world of 1, and
a data-parallel job would train N independent copies and exit 0. The same
happens when a program built against one MPI is started by another MPI's
launcher. init() therefore compares the world it got with the size the
launcher announced, and stops with WorldSizeError naming the cause.

Who announces the size (first found wins):
  TNT_WORLD_SIZE            the tarantella launcher (every rank receives it)
  OMPI_COMM_WORLD_SIZE      Open MPI's mpirun
  PMI_SIZE                  MPICH's hydra, srun --mpi=pmi2
  SLURM_STEP_NUM_TASKS      srun, when it started the program directly (none of
                            the above set)
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["WorldSizeError", "announced_size", "check_world_size"]

_ANNOUNCERS = (
    ("TNT_WORLD_SIZE", "the tarantella launcher"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_SIZE", "the process manager (PMI)"),
    ("SLURM_STEP_NUM_TASKS", "srun"),
)


class WorldSizeError(RuntimeError):
    """The MPI world does not have the ranks the job was started with."""


def announced_size(environ: Mapping[str, str]) -> tuple[int, str, str] | None:
    """(size, variable, who) for the first announcer set to a whole number."""
    for variable, who in _ANNOUNCERS:
        value = environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), variable, who
    return None


def check_world_size(world_size: int, environ: Mapping[str, str]) -> None:
    found = announced_size(environ)
    if found is None or found[0] == world_size:
        return
    size, variable, who = found
    if world_size == 1:
        what = (f"this rank is alone in its MPI world, but {who} started {size} ranks "
                f"({variable}={size}): the ranks could not find each other, and would train "
                f"{size} independent copies")
    else:
        what = (f"the MPI world has {world_size} ranks, but {who} started {size} "
                f"({variable}={size})")
    hint = ("under Slurm, start the job with `tarantella -- program` inside the allocation "
            "(it runs mpirun there, which forms one world) or use srun with the MPI plugin "
            "your MPI needs (Open MPI 5: srun --mpi=pmix)"
            if variable == "SLURM_STEP_NUM_TASKS" or "SLURM_JOB_ID" in environ else
            "start the program with the mpirun of the MPI tarantella was built with "
            "(the `tarantella` launcher finds it)")
    raise WorldSizeError(f"{what}; {hint}")
