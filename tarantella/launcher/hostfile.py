"""Hostfiles: the hosts a job runs on, and how many ranks each may take.

One host per line; `#` starts a comment; blank lines are ignored. A host may give
its number of slots (ranks it takes when --npernode is not given) as `slots=K`
(Open MPI style) or `host:K` (MPICH style); without it a host has 1 slot:

    # two nodes with four ranks each
    node001 slots=4
    node002:4

Each host may be listed once. A hostfile that is missing, unreadable or lists no
host is an error.

The same hosts may be given on the command line: `-H node001:4,node002:4` (a count
of 1 may be left out: `-H node001,node002`).
"""
from __future__ import annotations

import dataclasses

__all__ = ["Host", "HostfileError", "parse_hostfile", "read_hostfile", "parse_host_list"]


class HostfileError(ValueError):
    """The hostfile cannot be used; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int | None  # None: not given (counts as 1)


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostfileError(f"{where}: slots must be a whole number >= 1, got {text!r}")
    return int(text)


def _check_new(name: str, seen: dict, where: str, first_seen: str, several: str = "slots=K") -> None:
    if name in seen:
        raise HostfileError(
            f"{where}: host {name!r} is already listed {first_seen}{seen[name]}; list each host "
            f"once and give it {several} for several ranks")


def parse_host_list(text: str) -> list[Host]:
    """`-H host1:2,host2:2`: hosts with their rank counts (1 when left out)."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for position, item in enumerate(text.split(","), start=1):
        where = f"-H {text!r}"
        name, sep, count = item.strip().rpartition(":")
        if not sep:
            name, count = item.strip(), None
        if not name:
            raise HostfileError(f"{where}: entry {position} ({item!r}) has no host name; "
                                f"write -H host1:2,host2:2")
        if count is not None and (not count.isdigit() or int(count) < 1):
            raise HostfileError(f"{where}: the count of host {name!r} must be a whole number "
                                f">= 1, got {count!r}; write -H {name}:2")
        _check_new(name, seen, where, "as entry ", several=f"a count ({name}:2)")
        seen[name] = position
        hosts.append(Host(name, int(count) if count is not None else None))
    return hosts


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *rest = line.split()
        name, slots = first, None
        if ":" in first:
            name, count = first.rsplit(":", 1)
            slots = _slots(count, where)
        for token in rest:
            key, sep, value = token.partition("=")
            if key == "slots" and sep:
                if slots is not None:
                    raise HostfileError(f"{where}: slots given twice for host {name!r}")
                slots = _slots(value, where)
            else:
                raise HostfileError(
                    f"{where}: unexpected {token!r}; expected 'host', 'host slots=K' or 'host:K'")
        if not name:
            raise HostfileError(f"{where}: no host name in {raw.strip()!r}")
        _check_new(name, seen, where, "on line ")
        seen[name] = number
        hosts.append(Host(name, slots))
    if not hosts:
        raise HostfileError(f"{source} lists no host (one host name per line expected)")
    return hosts


def read_hostfile(path: str) -> list[Host]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise HostfileError(f"hostfile {path!r} does not exist") from None
    except OSError as error:
        raise HostfileError(f"hostfile {path!r} cannot be read: {error.strerror}") from None
    return parse_hostfile(text, path)
