"""A progress display for sweeps: a line per run on stderr, with an estimate of the rest, and a line per
training step while a run measures (a run is minutes of silence otherwise)."""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, label: str, stream=None, enabled: bool = True):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text + "\n")
            self.stream.flush()

    def start(self, devices: int, what: str = "running") -> None:
        self._write(f"tnt-bench: [{self.done + 1}/{self.total}] {self.label}: {what} on "
                    f"{devices} device(s) ...")

    def step(self, devices: int, line: str) -> None:
        """One of the running program's steps ("step 3/12 (timed) 0.45 s")."""
        self._write(f"tnt-bench:       {devices} device(s): {line}")

    def finish(self, devices: int, summary: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        eta = f", about {left:.0f} s left" if self.done < self.total else ""
        self._write(f"tnt-bench: [{self.done}/{self.total}] {devices} device(s): {summary} "
                    f"({elapsed:.0f} s elapsed{eta})")
