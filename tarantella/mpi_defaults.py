"""Open MPI settings chosen for the user where they chose none: for the ranks a launch starts (the launcher) and
for a process that starts MPI itself (tarantella/runtime.py). A user's own OMPI_MCA_* always stands.

Note [Open MPI's components that tarantella leaves out]
- osc ucx: Open MPI 5 from PyPI probes its UCX one-sided component for the engine's shared windows and prints
  an error where UCX has no network; the engine needs only the shared-memory component for them.
- btl ofi, within one host: Open MPI's libfabric transport sleeps a whole second in MPI_Init where it finds no
  fabric, in every rank (measured here, Open MPI 5.0.11 from PyPI: `python -c "from mpi4py import MPI"` 1.08 s,
  0.08 s with OMPI_MCA_btl=^ofi; `mpirun -n 2` of it 1.17 s against 0.20 s). Ranks of one host talk through
  shared memory, so a launch whose ranks all run here (no hostfile, no Slurm allocation) leaves it out, and so
  does a process started without a launcher, alone in its world. Across hosts the fabric may be the network:
  there Open MPI's default stands.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["for_ranks", "for_this_process"]

_OSC = ("OMPI_MCA_osc", "^ucx")
_ONE_HOST_BTL = ("OMPI_MCA_btl", "^ofi")
_LAUNCHED = ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "TNT_LAUNCHED")  # set by mpirun, srun, tarantella


def for_ranks(user_set: Mapping[str, str], one_host: bool, under_slurm: bool) -> dict[str, str]:
    """What a launch exports to its ranks (`user_set`: the launcher's environment and the user's -x exports).
    srun starts its ranks with Slurm's own MPI set-up, which these are not for."""
    chosen = {} if under_slurm else dict([_OSC] + ([_ONE_HOST_BTL] if one_host else []))
    return {name: value for name, value in chosen.items() if name not in user_set}


def for_this_process(environ: Mapping[str, str]) -> dict[str, str]:
    """What a process sets before it starts MPI: a launched rank has its launcher's already."""
    chosen = dict([_OSC]) if any(name in environ for name in _LAUNCHED) else dict([_OSC, _ONE_HOST_BTL])
    return {name: value for name, value in chosen.items() if name not in environ}
