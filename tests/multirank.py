"""Run a Python program on several ranks through the launcher, for tests.

    result = run_ranks(3, "import os; print(os.environ['OMPI_COMM_WORLD_RANK'])")
    assert result.returncode == 0
    assert sorted(result.rank_stdout) == [0, 1, 2]

The program (source text or the path of a .py file) runs as
`python -m tarantella.launcher -n N [--output-on-all-devices] [launcher_args] -- script [args]`
in a new session; stdout and stderr are captured. With all_output (the default)
every rank's lines arrive tagged "[rank] " and are split into rank_stdout and
rank_stderr. A run that outlives `timeout` is killed with its whole process group
(the launcher and mpirun; the ranks' wrappers stop their programs within a second
once mpirun is gone) and RanksTimedOut is raised: a test fails, it never stalls.

Rank and size inside the program: rank_of_env() / size_of_env() below work for
Open MPI, MPICH and srun; copy them into the program's source when needed
(RANK_HELPERS is that source).
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from tarantella.launcher import launch_check

__all__ = ["RanksResult", "RanksTimedOut", "run_ranks", "launch_environment", "split_by_rank", "RANK_HELPERS",
           "REPO_ROOT"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A rank's line can come glued to the end of Open MPI's help banner (its closing line of dashes has no newline
# when a rank writes at the moment mpirun aborts): seen in test_fail_fast, where the failing rank's error then
# counted for no rank.
_TAGGED = re.compile(r"^-*\[(\d+)\] (.*)$")

RANK_HELPERS = '''
import os as _os
def rank_of_env():
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in _os.environ:
            return int(_os.environ[name])
    return 0
def size_of_env():
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        if name in _os.environ:
            return int(_os.environ[name])
    return 1
'''


class RanksTimedOut(AssertionError):
    """The run did not end within its timeout; the message holds its output so far."""


@dataclasses.dataclass
class RanksResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float                      # seconds, launcher start to end
    rank_stdout: dict[int, str]         # "[rank] " lines of stdout, untagged, per rank
    rank_stderr: dict[int, str]         # the same for stderr
    command: list[str]

    def describe(self) -> str:
        return (f"command: {' '.join(self.command)}\nexit code: {self.returncode} "
                f"after {self.elapsed:.1f} s\n--- stdout ---\n{self.stdout}"
                f"--- stderr ---\n{self.stderr}")

    def assert_printed(self, checks, ranks) -> None:
        """Every rank in `ranks` printed "OK <check>" for each of `checks` (the programs' convention)."""
        for rank in ranks:
            lines = self.rank_stdout.get(rank, "")
            for check in checks:
                assert f"OK {check}\n" in lines, f"rank {rank} missed {check!r}\n{self.describe()}"

    def check(self) -> "RanksResult":
        """Raise AssertionError with all output unless the job succeeded."""
        if self.returncode != 0:
            raise AssertionError("the job failed\n" + self.describe())
        return self


def split_by_rank(text: str) -> dict[int, str]:
    per_rank: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = _TAGGED.match(line)
        if match:
            per_rank.setdefault(int(match.group(1)), []).append(match.group(2) + "\n")
    return {rank: "".join(lines) for rank, lines in sorted(per_rank.items())}


def launch_environment(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """The test's environment with the repository first on PYTHONPATH and `env`'s entries (None removes)."""
    run_env = dict(os.environ)
    run_env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in run_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for name, value in (env or {}).items():
        if value is None:
            run_env.pop(name, None)
        else:
            run_env[name] = value
    return run_env


def run_ranks(n: int, code_or_script: str | os.PathLike, args: Sequence[str] = (),
              timeout: float = 60.0, launcher_args: Sequence[str] = (),
              env: Mapping[str, str | None] | None = None, all_output: bool = True) -> RanksResult:
    """Run the program on n ranks; env entries override (None removes) the test's
    environment; the repository is put first on PYTHONPATH. A launch that started no rank
    is retried once (Note [A launch that started no rank is retried once] in
    tarantella/launcher/launch_check.py)."""
    result = _run_once(n, code_or_script, args, timeout, launcher_args, env, all_output)
    first_error = launch_check.no_rank_started(result.returncode, result.stderr)
    if first_error is None:
        return result
    retried = _run_once(n, code_or_script, args, timeout, launcher_args, env, all_output)
    note = f"(the first launch started no rank and was retried: {first_error.group(0)})\n"
    return dataclasses.replace(retried, stderr=note + retried.stderr)


def _run_once(n, code_or_script, args, timeout, launcher_args, env, all_output) -> RanksResult:
    with tempfile.TemporaryDirectory(prefix="tnt-ranks-") as scratch:
        script = os.fspath(code_or_script)
        if not (script.endswith(".py") and os.path.isfile(script)):
            path = os.path.join(scratch, "program.py")
            with open(path, "w") as handle:
                handle.write(script)
            script = path
        run_env = launch_environment(env)
        command = [sys.executable, "-m", "tarantella.launcher", "-n", str(n),
                   *(["--output-on-all-devices"] if all_output else []), *launcher_args,
                   "--", script, *args]
        start = time.monotonic()
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=run_env, start_new_session=True,
                                   text=True, errors="replace")
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                stdout, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a grandchild still holds the pipes
                process.kill()
                stdout, stderr = "", "(output lost: pipes still held after the kill)"
            raise RanksTimedOut(
                f"{n} ranks did not finish within {timeout} s; killed.\n"
                f"command: {' '.join(command)}\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}"
            ) from None
        elapsed = time.monotonic() - start
    return RanksResult(process.returncode, stdout, stderr, elapsed,
                       split_by_rank(stdout), split_by_rank(stderr), command)
