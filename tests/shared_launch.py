"""Many test programs in one launch per rank count, as Horovod runs `horovodrun -np 2 pytest` and mpi4py
`mpiexec -n 2 python test/main.py`: a launch's ranks import TensorFlow and start the engine once, then run
the programs one after the other (tests/rank_runner.py).

    KERAS = SharedLaunch(env=ENV, programs=[
        Program("fit", os.path.join(PROGRAMS, "fit_matches_serial.py"), ranks=(1, 2, 3, 4), timeout=400),
        Program("zoo", os.path.join(PROGRAMS, "keras_io_zoo.py"), args=("--floatx", "float64"), ranks=(2,)),
    ])

    @KERAS.test("fit")
    @pytest.mark.parametrize("n", [1, 2, 3, 4])
    def test_fit(n):
        run = KERAS.run("fit", n).check()      # a RanksResult of this program alone, as run_ranks gives

Note [Shared launches]
The first test that asks for a rank count starts the launch of every program wanted at that count (those of
the collected tests; tests/conftest.py tells the launch which) and waits for its own program only; the
launch goes on with the next programs while pytest moves to the next test, which tests/conftest.py has put
right behind (the tests of one launch run one after the other, in the programs' order). So a test's
duration is its program's, and one launch runs at a time: a launch starts once the previous one has ended.
A test reads only its own program's output and exit code: the ranks' lines between the program's markers.
Its timeout is the program's own, from the moment a rank starts it: a program that outlives it has the
launch killed, and its test fails with RanksTimedOut, as with run_ranks; a launch in which no program runs
for _BETWEEN_PROGRAMS_SECONDS (it hangs before its first program or between two) is killed too. A program
that fails or hangs ends the launch, so the programs after it do not run: their tests fail, naming it (a
failure stays within its launch). The launch's exit code counts for its last program (a crash at the end of
the job). Programs that are meant to fail, kill ranks or need launcher flags of their own keep run_ranks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Sequence

import pytest

from tests.multirank import RanksResult, RanksTimedOut, launch_environment, split_by_rank

__all__ = ["Program", "SharedLaunch", "MARKER"]

MARKER = "shared_launch"          # pytest marker: (SharedLaunch, program name); tests/conftest.py reads it
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_runner.py")
_MARK_LINE = re.compile(r"^-*\[(\d+)\] @@tnt-(begin|end) (\S+)(?: 0)?$")   # a program ends with 0 only
_TAG = re.compile(r"^-*\[(\d+)\] ")
_FAILED_FIRST = re.compile(r"^tarantella: error: rank (\d+)\b.* failed first")   # the launcher's root cause
_POLL_SECONDS = 0.25
_BETWEEN_PROGRAMS_SECONDS = 180.0   # the launch's start (Python, TensorFlow, MPI) or the step to the next program
_ONE_AT_A_TIME = threading.Lock()   # held by the launch that runs


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    path: str
    args: Sequence[str] = ()      # "{scratch}" in one: an empty directory of the program's, gone after the launch
    ranks: Sequence[int] = (2,)
    timeout: float = 400.0        # seconds, from the moment a rank starts the program


class SharedLaunch:
    def __init__(self, programs: Sequence[Program], env: Mapping[str, str | None] | None = None):
        names = [program.name for program in programs]
        assert len(set(names)) == len(names), f"program names repeat: {names}"
        self.programs = list(programs)
        self.env = dict(env or {})
        self.wanted: set[tuple[str, int]] | None = None   # (program, n) of the collected tests; None: all
        self._launches: dict[int, _Launch] = {}

    @property
    def budget(self) -> float:
        """pytest's timeout for a test of the group: what every program of the largest launch may take."""
        counts = {n for program in self.programs for n in program.ranks}
        return 60 + max(sum(p.timeout for p in self.programs if n in p.ranks) for n in counts)

    def marks(self, name: str) -> list:
        """The marks of a test (or a pytest.param) that reads program `name`: which launch and program (for
        tests/conftest.py's order and selection), multirank, and the timeout."""
        assert any(p.name == name for p in self.programs), f"no program {name}"
        return [getattr(pytest.mark, MARKER)(self, name), pytest.mark.multirank, pytest.mark.timeout(self.budget)]

    def test(self, name: str):
        """Decorator of a test that reads program `name` (marks)."""
        def decorate(function):
            for mark in self.marks(name):
                function = mark(function)
            return function
        return decorate

    def run(self, name: str, n: int) -> RanksResult:
        """The result of program `name` at n ranks, once its ranks have ended it."""
        program = next((p for p in self.programs if p.name == name), None)
        assert program is not None and n in program.ranks, f"{name} is not declared at {n} ranks"
        if n not in self._launches:
            wanted = [p for p in self.programs if n in p.ranks
                      and (self.wanted is None or (p.name, n) in self.wanted or p.name == name)]
            self._launches[n] = _Launch(n, wanted, self.env)
        return self._launches[n].result(name)


class _Launch:
    """One launch of the programs, read as it runs (Note [Shared launches])."""

    def __init__(self, n: int, programs: list[Program], env: dict):
        self.n = n
        self.programs = programs
        self._scratch = tempfile.TemporaryDirectory(prefix="tnt-shared-launch-")
        plan = json.dumps([[p.name, os.fspath(p.path), *self._arguments(p)] for p in programs])
        self.command = [sys.executable, "-m", "tarantella.launcher", "-n", str(n), "--output-on-all-devices",
                        "--", RUNNER, plan]
        self.lines = {"stdout": [], "stderr": []}
        self.begun: dict[str, float] = {}                              # when the first rank began it
        self.in_program: dict[int, str] = {}                           # rank -> the program it began last
        self.ended: dict[tuple[str, str], set[int]] = {}               # (stream, program) -> ranks that ended it
        self.ended_at: dict[str, float] = {}
        self.timed_out: str | None = None
        self.stalled = False                                           # no program began in time
        self.last_marker = time.monotonic()
        self.returncode: int | None = None
        self._changed = threading.Condition()
        _ONE_AT_A_TIME.acquire()
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, env=launch_environment(env),
                                            start_new_session=True, text=True, errors="replace")
        except BaseException:
            _ONE_AT_A_TIME.release()
            raise
        self._readers = [threading.Thread(target=self._read, args=(stream, getattr(self.process, stream)),
                                          daemon=True) for stream in self.lines]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _arguments(self, program: Program) -> list[str]:
        if not any("{scratch}" in arg for arg in program.args):
            return list(program.args)
        directory = os.path.join(self._scratch.name, program.name)
        os.makedirs(directory)
        return [arg.replace("{scratch}", directory) for arg in program.args]

    def _read(self, stream: str, pipe) -> None:
        for line in pipe:
            match = _MARK_LINE.match(line.rstrip("\n"))
            with self._changed:
                self.lines[stream].append(line)
                if match:
                    self.last_marker = time.monotonic()
                    rank, kind, name = int(match.group(1)), match.group(2), match.group(3)
                    if kind == "begin":
                        self.begun.setdefault(name, time.monotonic())
                        self.in_program[rank] = name
                    else:
                        self.ended.setdefault((stream, name), set()).add(rank)
                        self.ended_at[name] = time.monotonic()
                    self._changed.notify_all()

    def _watch(self) -> None:
        """Wait for the launch's end; kill it when a program outlives its timeout, or when no program runs and
        none began for _BETWEEN_PROGRAMS_SECONDS (a launch that hangs before its first program)."""
        try:
            while self.process.poll() is None:
                time.sleep(_POLL_SECONDS)
                with self._changed:
                    late = next((p.name for p in self.programs if p.name in self.begun and not self._done(p.name)
                                 and time.monotonic() - self.begun[p.name] > p.timeout), None)
                    idle = all(self._done(name) for name in self.begun) and \
                        time.monotonic() - self.last_marker > _BETWEEN_PROGRAMS_SECONDS
                if late is not None or idle:
                    self.timed_out, self.stalled = late, idle
                    try:
                        os.killpg(self.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.process.wait()
            for reader in self._readers:
                reader.join(timeout=10)
        finally:
            with self._changed:
                self.returncode = self.process.returncode
                self._changed.notify_all()
            self._scratch.cleanup()
            _ONE_AT_A_TIME.release()

    def _done(self, name: str) -> bool:
        return all(len(self.ended.get((stream, name), ())) == self.n for stream in self.lines)

    def result(self, name: str) -> RanksResult:
        last = name == self.programs[-1].name
        with self._changed:
            while self.returncode is None and (last or not self._done(name)):
                self._changed.wait(timeout=1.0)
            return self._result(name)

    def _culprit(self) -> str | None:
        """The program that ended the launch early: the one that timed out, else the one the rank that failed
        first (the launcher names it) was in, else the first that a rank began and not every rank ended. The
        ranks the launcher stops may be in other programs then, before or after it, that were going well."""
        if self.timed_out is not None:
            return self.timed_out
        failed = next((int(match.group(1)) for match in map(_FAILED_FIRST.match, self.lines["stderr"]) if match),
                      None)
        if failed in self.in_program:
            return self.in_program[failed]
        return next((p.name for p in self.programs if p.name in self.begun and not self._done(p.name)), None)

    def _result(self, name: str) -> RanksResult:
        whole = (f"command: {' '.join(self.command)}\n--- stdout ---\n{''.join(self.lines['stdout'])[-6000:]}"
                 f"--- stderr ---\n{''.join(self.lines['stderr'])[-6000:]}")
        culprit = self._culprit() if self.returncode is not None else None
        out, err = (_between(self.lines[stream], name) for stream in ("stdout", "stderr"))
        if name == self.timed_out:
            raise RanksTimedOut(f"{name}: {self.n} ranks did not finish within "
                                f"{next(p.timeout for p in self.programs if p.name == name)} s; killed.\n"
                                f"command: {' '.join(self.command)}\n--- stdout ---\n{out}--- stderr ---\n{err}")
        if name not in self.begun or (culprit not in (None, name) and not self._done(name)):
            what = "did not run" if name not in self.begun else "did not finish on every rank"
            stall = f"; killed after {_BETWEEN_PROGRAMS_SECONDS:g} s without a program" if self.stalled else ""
            raise AssertionError(f"{name} {what} at {self.n} ranks: the shared launch ended "
                                 f"{'in ' + culprit if culprit else 'before it'} (exit code "
                                 f"{self.returncode}{stall})\n{whole}")
        code = 0 if self._done(name) else (self.returncode or 1)
        if name == self.programs[-1].name and self.returncode:
            code = code or self.returncode   # the launch's end is its last program's
        elapsed = self.ended_at.get(name, time.monotonic()) - self.begun[name]
        program = next(p for p in self.programs if p.name == name)
        command = self.command + [f"(program {name}: {program.path} {' '.join(program.args)})"]
        return RanksResult(code, out, err, elapsed, split_by_rank(out), split_by_rank(err), command)


def _between(lines: list[str], name: str) -> str:
    """The ranks' lines between their begin and end markers of program `name`, tags kept."""
    inside: set[int] = set()
    kept = []
    for line in lines:
        match = _MARK_LINE.match(line.rstrip("\n"))
        if match:
            if match.group(3) == name:
                (inside.add if match.group(2) == "begin" else inside.discard)(int(match.group(1)))
            continue
        tag = _TAG.match(line)
        if tag and int(tag.group(1)) in inside:
            kept.append(line)
    return "".join(kept)
