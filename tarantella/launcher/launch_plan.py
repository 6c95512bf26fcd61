"""The launch plan: what the user asked for, resolved and checked, before any
MPI-specific spelling (mpirun_command.py turns it into a command line).

Placement rules (see also the manual in cli.py):
  --hostfile or -H, no -n
                        every host takes --npernode ranks, or its slots (1 if not
                        given) when --npernode is absent; n is the sum
  --hostfile/-H and -n  hosts are filled in file order up to those numbers; asking
                        for more ranks than they offer is an error
  -n, no hostfile       all ranks on this host (inside a Slurm allocation: mpirun
                        places them on the allocation's nodes, at most SLURM_NTASKS)
  neither               1 rank on this host (in Slurm: SLURM_NTASKS ranks if set)
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from typing import Callable, Mapping

from tarantella import mpi_defaults
from tarantella.config import load_config

from . import pinning
from .hostfile import parse_host_list, read_hostfile
from .mpi_detect import SLURM
from .network import check_launch_agent, check_network_interface
from .rank_wrapper import THREAD_VARIABLES
from .setting_flags import resolve_setting_env

__all__ = ["LaunchPlan", "PlanError", "make_plan", "program_command"]

_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PlanError(ValueError):
    """The request cannot be launched; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    nranks: int
    hosts: tuple[tuple[str, int], ...]  # (host, ranks on it) in rank order; () = not chosen by us
    npernode: int | None                # ranks per host, when the user gave --npernode
    ranks_per_host: int | None          # the most ranks any host gets; None if srun decides
    program: tuple[str, ...]            # what every rank runs (interpreter included)
    rank_env: dict[str, str]            # exported to every rank, in this order
    output_all: bool                    # --output-on-all-devices
    errors_all: bool                    # --log-on-all-devices
    pin_prefixes: tuple[str, ...] = ()  # numactl prefix per local rank; () = no pinning
    threads_per_rank: int | None = None  # thread default: pinned, the CPUs of one NUMA node;
                                         # in Slurm, SLURM_CPUS_PER_TASK
    bind_cores: bool = False            # each local rank on its share of the host's cores (rank_wrapper.py)
    in_slurm: bool = False              # inside an allocation, which places the ranks
    launch_agent: str | None = None     # --launch-agent: starts MPI's daemons on other hosts
    network_interface: str | None = None  # --network-interface: interface name or subnet


def parse_exports(items: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """-x NAME=VALUE as given; -x NAME forwards NAME's value in the launcher's environment (mpirun -x NAME)."""
    exported: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _VARIABLE_NAME.match(name):
            raise PlanError(f"-x {item!r}: {name!r} is not a valid environment variable name")
        if not sep:
            if name not in environ:
                raise PlanError(f"-x {name}: {name} is not set in this environment; set it, or write "
                                f"-x {name}=VALUE")
            value = environ[name]
        exported[name] = value
    return exported


def program_command(program: list[str], interpreter: str | None,
                    path: str | None = None) -> list[str]:
    """A program ending in .py, or starting with an interpreter option (-m module,
    -c code), runs with the interpreter; anything else runs as a binary."""
    if not program:
        raise PlanError("no program given; write: tarantella [options] -- program [args]")
    words = [sys.executable] if interpreter is None else shlex.split(interpreter)
    first = program[0]
    with_interpreter = bool(words) and (first.startswith("-") or first.endswith(".py"))
    if first.startswith("-") and not words:
        raise PlanError(f"{first!r} is an interpreter option, but --python-interpreter is empty")
    if first.endswith(".py") and with_interpreter and not os.path.isfile(first):
        raise PlanError(f"program {first!r} does not exist (relative to {os.getcwd()})")
    command = words + list(program) if with_interpreter else list(program)
    if shutil.which(command[0], path=path) is None:
        what = "--python-interpreter" if with_interpreter else "program"
        raise PlanError(f"{what} {command[0]!r} is not an executable file nor on PATH")
    return command


def _slurm_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _placement(args, environ: Mapping[str, str], launcher_kind: str):
    """(nranks, hosts, ranks_per_host)."""
    if args.nranks is not None and args.nranks < 1:
        raise PlanError(f"-n must be at least 1, got {args.nranks}")
    if args.npernode is not None and args.npernode < 1:
        raise PlanError(f"--npernode must be at least 1, got {args.npernode}")
    if args.hostfile is not None and args.host_list is not None:
        raise PlanError("--hostfile and -H both give the hosts; use one of them")
    if args.hostfile is not None or args.host_list is not None:
        hosts = read_hostfile(args.hostfile) if args.hostfile is not None \
            else parse_host_list(args.host_list)
        source = args.hostfile if args.hostfile is not None else f"-H {args.host_list}"
        capacity = [args.npernode or host.slots or 1 for host in hosts]
        nranks = sum(capacity) if args.nranks is None else args.nranks
        if nranks > sum(capacity):
            per = f"--npernode {args.npernode}" if args.npernode else "their slots"
            raise PlanError(
                f"-n {nranks} asks for more ranks than the {len(hosts)} host(s) of {source} "
                f"offer with {per} ({sum(capacity)}); add hosts, raise --npernode or slots=K, "
                f"or lower -n")
        placed, left = [], nranks
        for host, room in zip(hosts, capacity):
            if left == 0:
                break
            take = min(room, left)
            placed.append((host.name, take))
            left -= take
        return nranks, tuple(placed), max(take for _, take in placed)
    if environ.get("SLURM_JOB_ID"):  # the allocation places the ranks
        tasks = _slurm_int(environ, "SLURM_NTASKS")
        nranks = args.nranks or tasks or 1
        if tasks and nranks > tasks and launcher_kind != SLURM:
            raise PlanError(
                f"-n {nranks} asks for more ranks than Slurm job {environ['SLURM_JOB_ID']} has "
                f"tasks (SLURM_NTASKS={tasks}); lower -n or allocate more (sbatch/salloc -n)")
        return nranks, (), args.npernode
    if args.nranks is not None and args.npernode is not None and args.nranks != args.npernode:
        raise PlanError(
            f"without --hostfile all ranks run on this host, so -n {args.nranks} and "
            f"--npernode {args.npernode} disagree; give one of them, or a --hostfile "
            f"(-N is mpirun's ranks per host; for srun's number of nodes give the hosts with -H or "
            f"--hostfile)")
    nranks = args.nranks or args.npernode or 1
    return nranks, (), nranks


def make_plan(args, environ: Mapping[str, str], launcher_kind: str,
              probe_numa: Callable[[], list] = pinning.probe_numa_nodes) -> LaunchPlan:
    nranks, hosts, ranks_per_host = _placement(args, environ, launcher_kind)
    in_slurm = bool(environ.get("SLURM_JOB_ID")) and not hosts
    program = program_command(list(args.program), args.python_interpreter, environ.get("PATH"))
    exported = parse_exports(args.exports, environ)
    settings = resolve_setting_env(args, exported, environ)
    config = load_config(settings)

    rank_env = dict(settings)
    for name in THREAD_VARIABLES:  # set by the user for the launcher: every rank gets it
        if name in environ and name not in exported:
            rank_env[name] = environ[name]
    rank_env.update((name, value) for name, value in exported.items() if name not in settings)
    rank_env["TNT_LAUNCHED"] = "1"
    rank_env["TNT_WORLD_SIZE"] = str(nranks)  # a rank alone in a world stops (world_check.py)
    # Set here too (the library sets them as well) for programs that start MPI through mpi4py first.
    rank_env.update(mpi_defaults.for_ranks({**environ, **exported}, one_host=not hosts and not in_slurm,
                                           under_slurm=launcher_kind == SLURM))

    agent = check_launch_agent(args.launch_agent) if args.launch_agent is not None else None
    interface = None if args.network_interface is None \
        else check_network_interface(args.network_interface)

    prefixes, threads = (), None
    if args.pin_to_socket or args.pin_memory_to_socket:
        nodes = probe_numa()
        if ranks_per_host is not None:
            pinning.check_ranks_fit(ranks_per_host, nodes)
        prefixes = tuple(pinning.numactl_prefixes(nodes, membind=args.pin_memory_to_socket))
        threads = min(len(node.cpus) for node in nodes)
    elif in_slurm:
        threads = _slurm_int(environ, "SLURM_CPUS_PER_TASK")  # sbatch -c: each rank's CPUs
    # Note [Binding each rank to its share of the cores] in rank_wrapper.py: not where numactl pins whole
    # sockets, not in Slurm (srun's --cpu-bind), not when --bind-to none said so.
    bind_cores = not prefixes and not in_slurm and getattr(args, "bind_cores", True)

    return LaunchPlan(nranks=nranks, hosts=hosts, npernode=args.npernode, in_slurm=in_slurm,
                      ranks_per_host=ranks_per_host, program=tuple(program), rank_env=rank_env,
                      output_all=config.output_on_all_devices, errors_all=config.log_on_all_devices,
                      pin_prefixes=prefixes, threads_per_rank=threads, bind_cores=bind_cores,
                      launch_agent=agent, network_interface=interface)
