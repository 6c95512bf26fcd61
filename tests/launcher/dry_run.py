"""Helpers for launcher tests: run `main([... --dry-run ...])` and read the command."""
from __future__ import annotations

import shlex

from tarantella.launcher.cli import main
from tarantella.launcher.local_host import LocalHost
from tarantella.launcher.mpi_detect import MPICH, OPENMPI, MpiLauncher
from tarantella.launcher.mpirun_command import WRAPPER_PATH

OPENMPI_LAUNCHER = MpiLauncher(OPENMPI, "/opt/ompi/bin/mpirun", "mpirun (Open MPI) 5.0.11")
MPICH_LAUNCHER = MpiLauncher(MPICH, "/opt/mpich/bin/mpiexec", "HYDRA build details:")
ROOT_HOST = LocalHost(physical_cores=4, is_root=True)
USER_HOST = LocalHost(physical_cores=4, is_root=False)


def dry_run(capsys, argv, **machine) -> list[str]:
    """The argv that `tarantella --dry-run argv` prints (asserting it succeeded)."""
    machine.setdefault("launcher", OPENMPI_LAUNCHER)
    machine.setdefault("local_host", USER_HOST)
    code = main(["--dry-run", *argv], **machine)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("\n") == 1, out
    return shlex.split(out)


def launcher_part(command: list[str]) -> list[str]:
    """The words before the wrapper's interpreter (mpirun and its options)."""
    return command[:command.index(WRAPPER_PATH) - 1]


def wrapper_part(command: list[str]) -> list[str]:
    """The wrapper's options, between its path and `--`."""
    start = command.index(WRAPPER_PATH) + 1
    return command[start:command.index("--", start)]


def program_part(command: list[str]) -> list[str]:
    return command[command.index("--", command.index(WRAPPER_PATH)) + 1:]


def exported(command: list[str]) -> dict[str, str]:
    """Variables given to every rank: -x K=V (Open MPI), -genv K V (MPICH), env K=V (srun)."""
    words = launcher_part(command)
    found = {}
    if words[0] == "env":
        for word in words[1:]:
            if "=" not in word:
                break
            name, _, value = word.partition("=")
            found[name] = value
        return found
    for i, word in enumerate(words):
        if word == "-x":
            name, _, value = words[i + 1].partition("=")
            found[name] = value
        elif word == "-genv":
            found[words[i + 1]] = words[i + 2]
    return found
