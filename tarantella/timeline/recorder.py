"""The per-process event buffer of the timeline.

Events are appended as plain tuples to a list (one append per event, no I/O) and
written once, at exit. Times are CLOCK_MONOTONIC seconds (time.monotonic, the
engine's steady_clock and the marks of csrc/tf/timeline_ops.cc share it); the
buffer keeps this process's offset to the wall clock so that ranks on different
hosts land on one time axis when merged.
"""
from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["Recorder", "Event"]

# (kind, name, track, start seconds, duration seconds, args); kind "X" = span, "i" = instant
Event = tuple


class Recorder:
    def __init__(self):
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self.wall_offset = time.time() - time.monotonic()

    def complete(self, name: str, track: str, start: float, end: float, **args) -> None:
        """A span that already happened, [start, end] in monotonic seconds."""
        with self._lock:
            self.events.append(("X", name, track, start, max(0.0, end - start), args))

    def instant(self, name: str, track: str, when: float, **args) -> None:
        with self._lock:
            self.events.append(("i", name, track, when, 0.0, args))

    @contextlib.contextmanager
    def span(self, name: str, track: str, **args):
        start = time.monotonic()
        try:
            yield
        finally:
            self.complete(name, track, start, time.monotonic(), **args)

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def since(self, index: int) -> tuple[list[Event], int]:
        """The events recorded after the first `index`, and how many there are now."""
        with self._lock:
            return self.events[index:], len(self.events)
