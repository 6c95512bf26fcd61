"""The timeline of this process: on or off, where it goes, and writing it at exit.

Note [Timeline files]
`tarantella --timeline FILE` (TNT_TIMELINE) turns it on. Every rank buffers
its events in memory (recorder.py) and writes nothing while it trains. At exit
each rank writes its own events to FILE.rank<R>.json, a complete trace on its
own; the master then waits (up to a minute) for every rank's file, merges them
into FILE and removes them. No collective runs at exit: the job may be ending
because a rank is gone, and MPI_Finalize right after a last collective was seen
to hang (windows freed in MPI_Finalize while the ranks arrive together). A job
that dies or is stopped (an uncaught exception, SIGINT / Ctrl-C, SIGTERM), or
whose hosts share no file system, leaves the per-rank files:
`python -m tarantella.timeline merge FILE` merges them into FILE. Files are
replaced atomically, so an interrupted write never leaves a truncated trace.
"""
from __future__ import annotations

import atexit
import glob
import logging
import os
import signal
import sys
import time

from tarantella.timeline import trace_file
from tarantella.timeline.recorder import Recorder

__all__ = ["start", "recorder", "enabled", "rank_file", "write_rank_file", "finish", "abandon", "merge_rank_files"]

logger = logging.getLogger("tarantella")

_state: dict = {}
# How long the master waits at exit for the other ranks' files (written at the same moment as its own).
_MERGE_WAIT_SECONDS = 60.0


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


def abandon() -> None:
    """The job is ending abnormally (an uncaught exception, before MPI_Abort): this rank's file only."""
    if _state and not _state.get("finished"):
        _state["interrupted"] = _state["finished"] = True
        try:
            path = write_rank_file()
            logger.warning("tarantella: timeline of rank %d left in %s; merge the ranks' files with "
                           "`python -m tarantella.timeline merge %s`", _state["rank"], path, _state["path"])
        except OSError as error:  # never hide the failure that ends the job
            logger.warning("tarantella: could not write the timeline of rank %d: %s", _state["rank"], error)


def _this_rank() -> dict:
    record = _state["recorder"]
    return trace_file.rank_trace(_state["rank"], record.snapshot(), record.wall_offset)


def finish() -> None:
    """At exit: this rank's file; on the master of a cleanly ending job, the merged file too."""
    if not _state or _state.get("finished"):
        return
    _state["finished"] = True
    own = write_rank_file()
    clean = not _state["interrupted"] and sys.exc_info()[0] is None
    if _state["rank"] != 0:
        return
    if _state["size"] == 1:
        trace_file.write_trace(_state["path"], trace_file.read_trace(own))
        os.unlink(own)
        return
    expected = [rank_file(_state["path"], rank) for rank in range(_state["size"])]
    deadline = time.monotonic() + (_MERGE_WAIT_SECONDS if clean else 0.0)
    while not all(os.path.exists(name) for name in expected) and time.monotonic() < deadline:
        time.sleep(0.05)
    missing = [name for name in expected if not os.path.exists(name)]
    if missing:
        logger.warning("tarantella: the timeline's rank files %s are missing (a rank failed, or the ranks share "
                       "no file system); once they are all in %s, merge them with `python -m tarantella.timeline "
                       "merge %s`", ", ".join(missing), os.path.dirname(_state["path"]), _state["path"])
        return
    merge_rank_files(_state["path"])
    for name in expected:
        os.unlink(name)


def merge_rank_files(path: str) -> tuple[str, int]:
    """Merge FILE.rank*.json (left by a job that did not end cleanly) into FILE; (FILE, ranks merged)."""
    found = sorted(glob.glob(glob.escape(path) + ".rank*.json"))
    if not found:
        raise FileNotFoundError(f"tarantella: no per-rank timeline files {path}.rank<R>.json to merge")
    trace_file.write_trace(path, trace_file.merge_files([trace_file.read_trace(name) for name in found]))
    return path, len(found)
