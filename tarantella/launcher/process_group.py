"""Stopping a process started in a session of its own (`start_new_session=True`) together with
everything it started: the launcher, mpirun and the ranks of a job, a test's daemons.

The one home of "SIGTERM to the group, wait, then SIGKILL" for the harnesses (tnt-repro's runs,
the namespace cluster's `run`, the Slurm test cluster). SIGTERM first lets a launcher end its
ranks and report; SIGKILL follows when the group does not end within the grace period.
"""
from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["stop_process_group"]


def stop_process_group(process: subprocess.Popen, grace_seconds: float = 5.0,
                       kill_wait_seconds: float = 10.0) -> None:
    """SIGTERM to process's group; SIGKILL if the leader has not ended after grace_seconds."""
    for signum, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, kill_wait_seconds)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
