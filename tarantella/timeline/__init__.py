"""The timeline: a Chrome/Perfetto trace of a job (`tarantella --timeline FILE`).

Span names are documented in Note [Timeline span names] (names.py); files in
Note [Timeline files] (session.py); `python -m tarantella.timeline` merges,
measures the overlap of (overlap) and draws a step of (render) a trace. Other parts of tarantella (pipelining) and
user programs add spans with `span(name, track=..., **args)`; while the
timeline is off it costs one dictionary lookup.
"""
from __future__ import annotations

import contextlib
import time

from tarantella.timeline import names
from tarantella.timeline.session import enabled, start

__all__ = ["enabled", "start", "span", "complete", "instant", "names"]


def span(name: str, track: str = "python", **args):
    """Context manager: a span `name` on this rank's `track` around the block (nothing while off)."""
    recorder = session_recorder()
    if recorder is None:
        return contextlib.nullcontext()
    return recorder.span(name, track, **args)


def complete(name: str, start_seconds: float, end_seconds: float, track: str = "python", **args) -> None:
    """A span that already happened, in time.monotonic() seconds."""
    recorder = session_recorder()
    if recorder is not None:
        recorder.complete(name, track, start_seconds, end_seconds, **args)


def instant(name: str, track: str = "python", when: float | None = None, **args) -> None:
    recorder = session_recorder()
    if recorder is not None:
        recorder.instant(name, track, time.monotonic() if when is None else when, **args)


def session_recorder():
    from tarantella.timeline import session
    return session.recorder()
