"""The timeline of this process: on or off, where it goes, and writing it at exit.

Note [Timeline files]
`tarantella --timeline FILE` (TNT_TIMELINE) turns it on. Every rank buffers
its events in memory (recorder.py) and writes nothing while it trains. At exit
each rank first writes its own events to FILE.rank<R>.json, a complete trace on
its own; at a clean exit of a multi-rank job the ranks then gather their events
on the master (tarantella.collectives.allgather_object), the master writes the
merged FILE, and the per-rank files are removed. A job that dies or is stopped
(SIGINT / Ctrl-C, SIGTERM) skips the collective step, which could wait for a
rank that is gone, and leaves the per-rank files: `python -m tarantella.timeline
merge FILE` merges them into FILE. Files are replaced atomically, so an
interrupted write never leaves a truncated trace.
"""
from __future__ import annotations

import atexit
import glob
import logging
import os
import signal
import sys

from tarantella.timeline import trace_file
from tarantella.timeline.recorder import Recorder

__all__ = ["start", "recorder", "enabled", "rank_file", "write_rank_file", "finish", "merge_rank_files"]

logger = logging.getLogger("tarantella")

_state: dict = {}


def enabled() -> bool:
    return bool(_state)


def recorder() -> Recorder | None:
    return _state.get("recorder")


def rank_file(path: str, rank: int) -> str:
    return f"{path}.rank{rank}.json"


def start(path: str, rank: int, size: int) -> Recorder:
    """Turn the timeline on for this process (idempotent); called by tarantella.init."""
    if _state:
        return _state["recorder"]
    _state.update(recorder=Recorder(), path=os.path.abspath(path), rank=rank, size=size, interrupted=False)
    atexit.register(finish)
    for signum in (signal.SIGINT, signal.SIGTERM):
        _chain_signal(signum)
    return _state["recorder"]


def _chain_signal(signum: int) -> None:
    """On the signal: note the interruption and write this rank's file, then do what was done before."""
    try:
        previous = signal.getsignal(signum)
    except ValueError:
        return

    def handler(number, frame):
        _state["interrupted"] = True
        write_rank_file()
        if callable(previous):
            return previous(number, frame)
        if previous == signal.SIG_IGN:
            return None
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    try:
        signal.signal(signum, handler)
    except ValueError:  # not the main thread: the exit hook still writes the file
        pass


def write_rank_file() -> str | None:
    if not _state:
        return None
    target = rank_file(_state["path"], _state["rank"])
    content = trace_file.merge_traces([_this_rank()])
    trace_file.write_trace(target, content)
    return target


def _this_rank() -> dict:
    record = _state["recorder"]
    return trace_file.rank_trace(_state["rank"], record.snapshot(), record.wall_offset)


def finish() -> None:
    """At exit: this rank's file, then (clean multi-rank exit) the merged file on the master."""
    if not _state or _state.get("finished"):
        return
    _state["finished"] = True
    own = write_rank_file()
    clean = not _state["interrupted"] and sys.exc_info()[0] is None
    if _state["size"] == 1:
        trace_file.write_trace(_state["path"], trace_file.read_trace(own))
        os.unlink(own)
        return
    if not clean or not _engine_running():
        logger.warning("tarantella: timeline of rank %d left in %s; merge the ranks' files with "
                       "`python -m tarantella.timeline merge %s`", _state["rank"], own, _state["path"])
        return
    from tarantella import collectives
    ranks = collectives.allgather_object(_this_rank())
    if _state["rank"] == 0:
        trace_file.write_trace(_state["path"], trace_file.merge_traces(ranks))
    collectives.allgather_object(None)  # the merged file exists before any rank removes its own
    os.unlink(own)


def _engine_running() -> bool:
    try:
        from tarantella import runtime
        return runtime.is_initialized()
    except Exception:  # noqa: BLE001 - at exit, a half torn-down runtime means "no collective"
        return False


def merge_rank_files(path: str) -> tuple[str, int]:
    """Merge FILE.rank*.json (left by a job that did not end cleanly) into FILE; (FILE, ranks merged)."""
    found = sorted(glob.glob(glob.escape(path) + ".rank*.json"))
    if not found:
        raise FileNotFoundError(f"tarantella: no per-rank timeline files {path}.rank<R>.json to merge")
    trace_file.write_trace(path, trace_file.merge_files([trace_file.read_trace(name) for name in found]))
    return path, len(found)
