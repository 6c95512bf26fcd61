"""mpirun's and horovodrun's flags as their users type them by habit, in tarantella's terms.

`-np N`, `-N N` (also `-npernode`, `-ppn`), `-hostfile` and `-host`/`-hosts` are aliases of `-n N`,
`--npernode N`, `--hostfile` and `-H` (argparse, cli.py). This module takes the two flags that do not
map one to one: `--bind-to` (tarantella itself gives Open MPI `--bind-to none`, binds each local rank to
its share of the host's cores in its rank wrapper, and pins whole sockets with numactl) and `--map-by`
(tarantella fills each host's slots in order, mpirun's `--map-by slot`).
A value with no tarantella equivalent is refused with a one-line error saying what to write instead.
"""
from __future__ import annotations

import re

from .launch_plan import PlanError

__all__ = ["apply"]

_SOCKET_LIKE = ("socket", "package", "numa")
_PPR_NODE = re.compile(r"^ppr:(\d+):node$")


def apply(args) -> None:
    """Fold args.bind_to and args.map_by into tarantella's own flags (in place)."""
    if args.bind_to is not None:
        _bind_to(args, args.bind_to.split(":")[0].lower())
    if args.map_by is not None:
        _map_by(args, args.map_by.lower())


def _bind_to(args, what: str) -> None:
    if what == "none":
        if args.pin_to_socket or args.pin_memory_to_socket:
            raise PlanError("--bind-to none contradicts --pin-to-socket/--pin-memory-to-socket; give one of them")
        args.bind_cores = False
        return
    if what == "core":   # the default: each local rank on its share of the cores
        return
    if what in _SOCKET_LIKE:
        args.pin_to_socket = True
        return
    raise PlanError(f"--bind-to {args.bind_to}: tarantella binds each rank to its share of the cores (--bind-to "
                    f"core, the default) or whole sockets (--bind-to socket, numactl); write one of them, or "
                    f"--bind-to none to leave ranks unbound")


def _map_by(args, what: str) -> None:
    if what == "slot":  # mpirun's default, and the only order tarantella places ranks in
        return
    match = _PPR_NODE.match(what)
    if match is None:
        raise PlanError(f"--map-by {args.map_by}: tarantella places ranks host by host, filling each host's "
                        f"slots in order (--map-by slot); choose ranks per host with --npernode N (or --map-by "
                        f"ppr:N:node) and hosts with -H host:N / --hostfile")
    per_node = int(match.group(1))
    if per_node < 1:
        raise PlanError(f"--map-by {args.map_by}: a host must take at least 1 rank; write --map-by ppr:N:node "
                        f"with N >= 1")
    if args.npernode is not None and args.npernode != per_node:
        raise PlanError(f"--map-by {args.map_by} and --npernode {args.npernode} disagree; give one of them")
    args.npernode = per_node
