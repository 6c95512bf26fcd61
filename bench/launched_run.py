"""Running a launcher command in its own process group, so that a timeout or an
interrupt of tnt-bench stops every rank with it."""
from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["LaunchTimedOut", "run_launched"]


class LaunchTimedOut(Exception):
    """The command outlived its timeout and was killed; `stderr` is what it printed."""

    def __init__(self, stderr: str):
        super().__init__("timed out")
        self.stderr = stderr


def run_launched(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise LaunchTimedOut(stderr) from None
    except BaseException:  # Ctrl-C or SIGTERM of tnt-bench: the ranks must not outlive it
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
