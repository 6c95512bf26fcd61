"""How many devices the machine or hostfile provides, and which counts of a sweep fit."""
from __future__ import annotations

import dataclasses

from bench.errors import BenchUsageError
from bench.machine import physical_cores

__all__ = ["Capacity", "find_capacity", "split_counts", "is_oversubscribed"]


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


def split_counts(counts: list[int], capacity: Capacity, oversubscribe: bool) -> tuple[list[int], list[int]]:
    """(counts to run, counts beyond the capacity, to simulate); --oversubscribe runs them all
    on this machine (never beyond a hostfile's slots)."""
    if oversubscribe and capacity.where.startswith("this machine"):
        return list(counts), []
    return [c for c in counts if c <= capacity.devices], [c for c in counts if c > capacity.devices]


def is_oversubscribed(count: int, capacity: Capacity) -> bool:
    return count > capacity.devices
