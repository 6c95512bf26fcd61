"""How many devices the machine or hostfile provides, and refusing counts beyond it."""
from __future__ import annotations

import dataclasses

from bench.errors import BenchUsageError
from bench.machine import physical_cores

__all__ = ["Capacity", "find_capacity", "check_counts", "is_oversubscribed"]


@dataclasses.dataclass(frozen=True)
class Capacity:
    devices: int            # ranks the machine or hostfile provides without oversubscribing
    devices_per_node: int
    where: str              # for messages: "this machine (2 cores)", "hostfile H (3 hosts)"


def find_capacity(hostfile: str | None, npernode: int | None) -> Capacity:
    if hostfile is None:
        cores = physical_cores()
        per_node = npernode or cores
        return Capacity(min(cores, per_node), per_node, f"this machine ({cores} cores)")
    from tarantella.launcher.hostfile import HostfileError, read_hostfile
    try:
        hosts = read_hostfile(hostfile)
    except HostfileError as error:
        raise BenchUsageError(str(error)) from None
    per_host = [npernode or host.slots or 1 for host in hosts]
    return Capacity(sum(per_host), max(per_host), f"hostfile {hostfile} ({len(hosts)} hosts)")


def check_counts(counts: list[int], capacity: Capacity, oversubscribe: bool) -> None:
    """Refuse counts beyond the capacity; --oversubscribe allows them on one machine."""
    beyond = [c for c in counts if c > capacity.devices]
    if not beyond:
        return
    if oversubscribe and capacity.where.startswith("this machine"):
        return
    raise BenchUsageError(
        f"--devices asks for {', '.join(map(str, beyond))} devices but {capacity.where} provides "
        f"{capacity.devices}; add --simulate --cluster PROFILE to predict them, give a --hostfile "
        f"with more slots, or --oversubscribe to run more ranks than cores on this machine")


def is_oversubscribed(count: int, capacity: Capacity) -> bool:
    return count > capacity.devices
