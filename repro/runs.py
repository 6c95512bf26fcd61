"""Starting one run of the user's script (serially or through the launcher) and watching it.

Each run gets its own directory under the check's output: the recorder's files
(tarantella/_repro/hook.py), stdout.log and stderr.log, and ENDED_FILE once its processes
have ended (Note [Reading a reference while it runs] in tarantella/_repro/weights.py). A run that outlives its
timeout is killed with its whole process group (launcher, mpirun, ranks), so a
hanging script fails the check instead of stalling it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping

from tarantella._repro.protocol import ENDED_FILE
from tarantella.launcher import launch_check
from tarantella.launcher.process_group import stop_process_group

__all__ = ["RunSpec", "RunResult", "execute", "RUNNER", "DETERMINISM_FAILURE_PATTERNS"]

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
_POLL_SECONDS = 0.5

# TensorFlow's refusals under op determinism: a finding of the check, not a crash of the harness.
DETERMINISM_FAILURE_PATTERNS = (
    re.compile(r"Random ops require a seed to be set when determinism is enabled"),
    re.compile(r"does not have a deterministic implementation"),
    re.compile(r"Determinism is not yet supported"),
    re.compile(r"[Dd]eterministic .* (is|are) not supported"),
    re.compile(r"cannot be called when determinism is enabled"),
)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    name: str                      # e.g. "serial", "2 devices", "4 devices (repeat)"
    devices: int
    role: str                      # reference | calibration | distributed | repeat | as_written
    env: Mapping[str, str]         # added to the harness's environment
    use_launcher: bool             # False: plain `python` (1 rank)


@dataclasses.dataclass
class RunResult:
    spec: RunSpec
    directory: str
    returncode: int | None         # None: killed after the timeout
    seconds: float
    stderr_tail: list[str]

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    def failure_line(self) -> str:
        """The most telling line of the failure (an exception, or the launcher's root cause)."""
        if self.returncode is None:
            return "did not finish within the timeout (hang?); killed"
        lines = [re.sub(r"^\s*(\|\s?)?", "", line).rstrip() for line in self.stderr_tail]
        exception = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
        root_cause = next((line for line in lines if line.startswith("root cause")), None)
        if root_cause and exception:
            return f"{root_cause.split(':', 1)[1].split(',')[0].strip()}: {exception}"
        if exception or root_cause:
            return exception or root_cause
        meaningful = [line for line in lines if line]
        return meaningful[-1] if meaningful else f"exit code {self.returncode}"

    def determinism_failure(self) -> str | None:
        """TensorFlow's refusal of a non-deterministic op, if that is why the run failed."""
        for line in self.stderr_tail:
            if any(pattern.search(line) for pattern in DETERMINISM_FAILURE_PATTERNS):
                return line.strip()
        return None


def command(spec: RunSpec, script: str, script_args: list[str]) -> list[str]:
    program = [RUNNER, script, *script_args]
    if not spec.use_launcher:
        return [sys.executable, *program]
    exports = [item for key, value in sorted(spec.env.items()) for item in ("-x", f"{key}={value}")]
    return [sys.executable, "-m", "tarantella.launcher", "-n", str(spec.devices), *exports, "--", *program]


def _tail(path: str, lines: int = 60) -> list[str]:
    try:
        with open(path, errors="replace") as handle:
            return handle.read().splitlines()[-lines:]
    except OSError:
        return []


def _progress_step(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, "progress")) as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return None


def execute(spec: RunSpec, script: str, script_args: list[str], directory: str, timeout: float,
            on_progress: Callable[[int | None, float], None] = lambda step, seconds: None,
            stop: threading.Event | None = None) -> RunResult:
    """Run one launch; one that started no rank is launched once more (Note [A launch that started no
    rank is retried once] in tarantella/launcher/launch_check.py). Setting `stop` stops it (returncode None)."""
    stop = stop or threading.Event()
    result = _execute_once(spec, script, script_args, directory, timeout, on_progress, stop)
    with open(os.path.join(directory, "stderr.log")) as handle:
        first_error = launch_check.no_rank_started(result.returncode, handle.read())
    if first_error is not None:
        os.replace(os.path.join(directory, "stderr.log"), os.path.join(directory, "stderr.first-launch.log"))
        result = _execute_once(spec, script, script_args, directory, timeout, on_progress, stop)
    with open(os.path.join(directory, ENDED_FILE), "w"):
        pass
    return result


def _execute_once(spec: RunSpec, script: str, script_args: list[str], directory: str, timeout: float,
                  on_progress: Callable[[int | None, float], None], stop: threading.Event) -> RunResult:
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ)
    env.update(spec.env)
    env["TNT_REPRO_RECORD"] = directory
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stdout_path, stderr_path = os.path.join(directory, "stdout.log"), os.path.join(directory, "stderr.log")
    argv = command(spec, script, script_args)
    with open(os.path.join(directory, "command.txt"), "w") as handle:
        handle.write(" ".join(argv) + "\n")
    start = time.monotonic()
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                                   start_new_session=True, cwd=os.path.dirname(os.path.abspath(script)))
        returncode = None
        while True:
            try:
                returncode = process.wait(timeout=_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                on_progress(_progress_step(directory), elapsed)
                if elapsed > timeout or stop.is_set():
                    stop_process_group(process, grace_seconds=5.0)
                    break
    return RunResult(spec, directory, returncode, time.monotonic() - start, _tail(stderr_path))


