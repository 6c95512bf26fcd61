"""Running a launcher command in its own process group, so that a timeout or an
interrupt of tnt-bench stops every rank with it."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Callable

__all__ = ["LaunchTimedOut", "run_launched"]


class LaunchTimedOut(Exception):
    """The command outlived its timeout and was killed; `stderr` is what it printed."""

    def __init__(self, stderr: str):
        super().__init__("timed out")
        self.stderr = stderr


def run_launched(command: list[str], timeout_s: float,
                 on_stdout_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:
    """Run `command` to its end (killing its process group after `timeout_s`); `on_stdout_line` sees each
    line of stdout as it arrives (progress while a run measures), all of it is returned as well."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    stdout_lines, stderr_parts = [], []

    def read_stdout():
        for line in process.stdout:
            stdout_lines.append(line)
            if on_stdout_line is not None:
                on_stdout_line(line.rstrip("\n"))

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: stderr_parts.append(process.stderr.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for reader in readers:
            reader.join(5)
        raise LaunchTimedOut("".join(stderr_parts)) from None
    except BaseException:  # Ctrl-C or SIGTERM of tnt-bench: the ranks must not outlive it
        os.killpg(process.pid, signal.SIGKILL)
        raise
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(command, process.returncode, "".join(stdout_lines), "".join(stderr_parts))
