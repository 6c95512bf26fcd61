"""The progress display of `tnt-repro check`, on stderr.

On a terminal, one line per run is rewritten in place (run i of n, its name,
the step it reached, seconds so far); otherwise (logs, CI) a line when a run
starts and one when it ends.
"""
from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total_runs: int, total_steps: int | None, stream: TextIO = sys.stderr):
        self.total_runs = total_runs
        self.total_steps = total_steps
        self.stream = stream
        self.live = stream.isatty()
        self.index = 0
        self.name = ""

    def _prefix(self) -> str:
        return f"tnt-repro [{self.index}/{self.total_runs}] {self.name:<24}"

    def start(self, name: str) -> None:
        self.index += 1
        self.name = name
        if self.live:
            self.stream.write(f"\r{self._prefix()} starting")
        else:
            self.stream.write(f"{self._prefix()} started\n")
        self.stream.flush()

    def update(self, step: int | None, seconds: float) -> None:
        if not self.live:
            return
        of = f"/{self.total_steps}" if self.total_steps else ""
        where = "starting" if step is None else f"step {step}{of}"
        self.stream.write(f"\r{self._prefix()} {where:<14} {seconds:6.1f} s")
        self.stream.flush()

    def finish(self, status: str, seconds: float) -> None:
        line = f"{self._prefix()} {status:<14} {seconds:6.1f} s"
        self.stream.write(("\r" + line if self.live else line) + "\n")
        self.stream.flush()
