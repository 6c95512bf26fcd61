"""Pinning ranks to sockets with numactl (--pin-to-socket, --pin-memory-to-socket).

Definitions: numactl calls a socket's CPUs and memory a NUMA node; the launcher
treats each NUMA node that has CPUs as one socket (with sub-NUMA clustering a
socket shows up as several NUMA nodes, and each counts as one). Local rank i of a
host is pinned to the i-th such node listed by `numactl --hardware` on the
launcher's host (hosts are assumed alike):

    --pin-to-socket          numactl --cpunodebind=S --preferred=S   (memory from S
                             while S has free memory, then from other nodes)
    --pin-memory-to-socket   numactl --cpunodebind=S --membind=S     (memory only
                             from S; implies --pin-to-socket)

So a host can take at most as many pinned ranks as it has NUMA nodes with CPUs.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

__all__ = ["NumaNode", "PinningError", "parse_numactl_hardware", "probe_numa_nodes",
           "numactl_prefixes", "check_ranks_fit"]


class PinningError(RuntimeError):
    """Pinning was asked for but cannot be done on this machine."""


@dataclasses.dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]


def parse_numactl_hardware(text: str) -> list[NumaNode]:
    """NUMA nodes that have CPUs, from the `node N cpus: ...` lines of `numactl --hardware`."""
    nodes = []
    for match in re.finditer(r"^node (\d+) cpus:(.*)$", text, re.MULTILINE):
        cpus = tuple(int(cpu) for cpu in match.group(2).split())
        if cpus:
            nodes.append(NumaNode(int(match.group(1)), cpus))
    return nodes


def probe_numa_nodes(numactl: str | None = None) -> list[NumaNode]:
    numactl = numactl or shutil.which("numactl")
    if numactl is None:
        raise PinningError(
            "--pin-to-socket and --pin-memory-to-socket need numactl, which is not on PATH; "
            "install it (e.g. apt-get install numactl, or load its module) or drop the flag")
    try:
        done = subprocess.run([numactl, "--hardware"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PinningError(f"`{numactl} --hardware` could not run: {error}") from None
    nodes = parse_numactl_hardware(done.stdout)
    if done.returncode != 0 or not nodes:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise PinningError(
            f"`{numactl} --hardware` shows no NUMA node with CPUs (exit code {done.returncode}"
            f"{': ' + detail[0] if detail else ''}); pinning is not possible here, drop the flag")
    return nodes


def numactl_prefixes(nodes: list[NumaNode], membind: bool) -> list[str]:
    """One command prefix per local rank: local rank i gets nodes[i]."""
    memory = "--membind" if membind else "--preferred"
    return [f"numactl --cpunodebind={node.id} {memory}={node.id}" for node in nodes]


def check_ranks_fit(ranks_per_node: int, nodes: list[NumaNode]) -> None:
    if ranks_per_node > len(nodes):
        ids = ",".join(str(node.id) for node in nodes)
        raise PinningError(
            f"pinning puts each rank of a host on its own socket, but {ranks_per_node} ranks per "
            f"host were asked and `numactl --hardware` shows {len(nodes)} NUMA node(s) with CPUs "
            f"({ids}); run at most {len(nodes)} rank(s) per host (--npernode {len(nodes)}) or "
            f"drop --pin-to-socket/--pin-memory-to-socket/--bind-to socket")
