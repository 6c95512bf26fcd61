"""The progress display of `tnt-repro check`, on stderr.

On a terminal, with one run at a time, one line per run is rewritten in place (run
i of n, its name, the step it reached, seconds so far); otherwise (logs, CI, runs side
by side: Note [Runs side by side] in repro/schedule.py) a line when a run starts and
one when it ends.
"""
from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total_runs: int, total_steps: int | None, stream: TextIO = sys.stderr,
                 live_updates: bool = True):
        self.total_runs = total_runs
        self.total_steps = total_steps
        self.stream = stream
        self.live = live_updates and stream.isatty()
        self.indices: dict[str, int] = {}

    def _prefix(self, name: str) -> str:
        return f"tnt-repro [{self.indices[name]}/{self.total_runs}] {name:<24}"

    def start(self, name: str) -> None:
        self.indices[name] = len(self.indices) + 1
        if self.live:
            self.stream.write(f"\r{self._prefix(name)} starting")
        else:
            self.stream.write(f"{self._prefix(name)} started\n")
        self.stream.flush()

    def update(self, name: str, step: int | None, seconds: float) -> None:
        if not self.live:
            return
        of = f"/{self.total_steps}" if self.total_steps else ""
        where = "starting" if step is None else f"step {step}{of}"
        self.stream.write(f"\r{self._prefix(name)} {where:<14} {seconds:6.1f} s")
        self.stream.flush()

    def finish(self, name: str, status: str, seconds: float) -> None:
        line = f"{self._prefix(name)} {status:<14} {seconds:6.1f} s"
        self.stream.write(("\r" + line if self.live else line) + "\n")
        self.stream.flush()
