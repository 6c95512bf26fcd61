"""--network-interface and --launch-agent: checked on the launcher's host before any
rank starts, so that a typo is one line and exit code 2 rather than an MPI error
from every host.

--network-interface takes an interface name (ib0, eth0) or a subnet in CIDR form
(10.1.0.0/16). mpirun's own daemon runs on this host and listens on that network,
so this host must have the interface, or an IPv4 address inside the subnet.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import shlex
import shutil
import socket
import struct

__all__ = ["NetworkError", "check_network_interface", "check_launch_agent", "local_addresses"]

_SIOCGIFADDR = 0x8915


class NetworkError(ValueError):
    """A network option that cannot work on this host; the message says why."""


def local_addresses() -> dict[str, str]:
    """{interface: IPv4 address} of this host's interfaces that have one."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address
                continue
            found[name] = socket.inet_ntoa(answer[20:24])
    return found


def check_network_interface(value: str) -> str:
    """The value, if this host has that interface or an address in that subnet."""
    names = [name for _, name in socket.if_nameindex()]
    if "/" in value:
        try:
            subnet = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise NetworkError(f"--network-interface {value!r} is neither an interface name "
                               f"nor a subnet like 10.1.0.0/16") from None
        addresses = local_addresses()
        if not any(ipaddress.ip_address(a) in subnet for a in addresses.values()):
            listed = ", ".join(f"{n} {a}" for n, a in addresses.items()) or "none"
            raise NetworkError(f"--network-interface {value}: this host has no address in that "
                               f"subnet (its addresses: {listed})")
        return value
    if value not in names:
        raise NetworkError(f"--network-interface {value!r}: no such network interface on this "
                           f"host (it has: {', '.join(names)})")
    return value


def check_launch_agent(value: str) -> str:
    """The value, if its first word is an executable program."""
    try:
        words = shlex.split(value)
    except ValueError as error:
        raise NetworkError(f"--launch-agent {value!r} cannot be split into words: {error}") \
            from None
    if not words:
        raise NetworkError("--launch-agent is empty; give a command such as 'ssh' or "
                           "'ssh -p 2222', or leave the option out")
    program = words[0]
    found = shutil.which(program) if os.sep not in program else (
        program if os.path.isfile(program) and os.access(program, os.X_OK) else None)
    if found is None:
        raise NetworkError(f"--launch-agent {value!r}: {program!r} is not an executable file "
                           f"nor on PATH")
    return value
