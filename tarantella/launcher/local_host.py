"""Facts about the host the launcher runs on that shape the mpirun command.

Kept in one small value so that command building can be tested with any facts
(a root user, a 64-core host) without that machine.
"""
from __future__ import annotations

import dataclasses
import glob
import os

__all__ = ["LocalHost", "probe_local_host", "physical_cores"]


@dataclasses.dataclass(frozen=True)
class LocalHost:
    physical_cores: int  # what Open MPI counts as slots on a host without a hostfile
    is_root: bool        # Open MPI refuses to run as root without --allow-run-as-root


def physical_cores() -> int:
    """Distinct (package, core) pairs of the online CPUs; os.cpu_count() if unknown."""
    cores = set()
    for topology in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(os.path.join(topology, "physical_package_id")) as package, \
                    open(os.path.join(topology, "core_id")) as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1


def probe_local_host() -> LocalHost:
    return LocalHost(physical_cores=physical_cores(), is_root=os.geteuid() == 0)
