"""The command line that starts the ranks, spelled for Open MPI, MPICH or srun.

Every rank runs rank_wrapper.py around the program (see that file). The variables
in LaunchPlan.rank_env reach every rank, on every host, through the MPI's own
export option (Open MPI `-x K=V`, MPICH `-genv K V`); srun exports its whole
environment by default, so for srun the command starts with `env K=V ...`. The
command printed by --dry-run is exactly the one that runs.

Open MPI specifics
  --allow-run-as-root   only when the launcher runs as root (euid 0)
  --bind-to none        always: Open MPI's default binds each rank to one core, so
                        all threads of a rank would share it; binding is the rank
                        wrapper's (each local rank on its share of the cores,
                        --bind-cores) or numactl's (--pin-to-socket)
  --oversubscribe       when, without a hostfile, more ranks than physical cores are
                        asked for (Open MPI would refuse to start them otherwise);
                        with a hostfile each host gets exactly its ranks as slots;
                        inside a Slurm allocation the allocation's tasks are the slots
                        (Note [mpirun inside Slurm] in mpi_detect.py)
  --mca plm_rsh_agent CMD                    from --launch-agent CMD (how mpirun starts
                        its daemon on another host; Open MPI's default is ssh)
  --mca btl_tcp_if_include X --mca oob_tcp_if_include X
                        from --network-interface X (the ranks' TCP traffic and the
                        daemons' control traffic stay on that interface or subnet)

MPICH (hydra) specifics
  -launcher-exec CMD    from --launch-agent CMD
  -iface IF             from --network-interface IF (hydra takes interface names only)
"""
from __future__ import annotations

import os
import shlex
import sys

from .launch_plan import LaunchPlan, PlanError
from .local_host import LocalHost
from .mpi_detect import MPICH, OPENMPI, SLURM, MpiLauncher

__all__ = ["WRAPPER_PATH", "rank_command", "build_command", "format_command"]

WRAPPER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_wrapper.py")


def rank_command(plan: LaunchPlan, python: str | None = None) -> list[str]:
    """What mpirun starts on every rank: the wrapper, its options, then the program."""
    command = [python or sys.executable, WRAPPER_PATH]
    if plan.output_all:
        command += ["--output", "all"]
    if plan.errors_all:
        command += ["--errors", "all"]
    for prefix in plan.pin_prefixes:
        command += ["--local-rank-prefix", prefix]
    if plan.threads_per_rank:
        command += ["--threads-per-rank", str(plan.threads_per_rank)]
    if plan.bind_cores:
        command.append("--bind-cores")
    return command + ["--", *plan.program]


def _host_list(plan: LaunchPlan) -> str:
    return ",".join(f"{host}:{ranks}" for host, ranks in plan.hosts)


def _openmpi(plan: LaunchPlan, launcher: MpiLauncher, local: LocalHost) -> list[str]:
    command = [launcher.path]
    if local.is_root:
        command.append("--allow-run-as-root")
    command += ["--bind-to", "none"]
    if not plan.hosts and not plan.in_slurm and plan.nranks > local.physical_cores:
        command.append("--oversubscribe")
    command += ["-n", str(plan.nranks)]
    if plan.hosts:
        command += ["--host", _host_list(plan)]
    if plan.npernode and (plan.hosts or plan.in_slurm):
        command += ["--map-by", f"ppr:{plan.npernode}:node"]
    if plan.launch_agent:
        command += ["--mca", "plm_rsh_agent", plan.launch_agent]
    if plan.network_interface:
        command += ["--mca", "btl_tcp_if_include", plan.network_interface,
                    "--mca", "oob_tcp_if_include", plan.network_interface]
    for name, value in plan.rank_env.items():
        command += ["-x", f"{name}={value}"]
    return command


def _mpich(plan: LaunchPlan, launcher: MpiLauncher) -> list[str]:
    command = [launcher.path, "-n", str(plan.nranks)]
    if plan.hosts:
        command += ["-hosts", _host_list(plan)]
        if plan.npernode:
            command += ["-ppn", str(plan.npernode)]
    if plan.launch_agent:
        command += ["-launcher-exec", plan.launch_agent]
    if plan.network_interface:
        if "/" in plan.network_interface:
            raise PlanError(f"--network-interface {plan.network_interface}: MPICH's mpiexec "
                            f"takes an interface name (-iface), not a subnet; give the name")
        command += ["-iface", plan.network_interface]
    for name, value in plan.rank_env.items():
        command += ["-genv", name, value]
    return command


def _slurm(plan: LaunchPlan, launcher: MpiLauncher) -> list[str]:
    command = ["env", *(f"{name}={value}" for name, value in plan.rank_env.items())]
    command += [launcher.path, "-n", str(plan.nranks)]
    if plan.npernode:
        command.append(f"--ntasks-per-node={plan.npernode}")
    if plan.hosts:
        command.append("--nodelist=" + ",".join(host for host, _ in plan.hosts))
    command.append("--kill-on-bad-exit=1")
    return command


def build_command(plan: LaunchPlan, launcher: MpiLauncher, local: LocalHost,
                  python: str | None = None) -> list[str]:
    if launcher.kind == OPENMPI:
        start = _openmpi(plan, launcher, local)
    elif launcher.kind == MPICH:
        start = _mpich(plan, launcher)
    elif launcher.kind == SLURM:
        start = _slurm(plan, launcher)
    else:
        raise AssertionError(f"unknown launcher kind {launcher.kind!r}")
    return start + rank_command(plan, python)


def format_command(argv: list[str]) -> str:
    """One line that a POSIX shell runs as exactly this argv."""
    return shlex.join(argv)
