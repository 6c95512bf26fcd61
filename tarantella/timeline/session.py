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

An elastic job (tarantella --elastic) runs as generations of processes (Note
[Elastic generations] in tarantella/launcher/elastic.py), so its ranks write
FILE.gen<G>.rank<R>.json, and no generation but the last merges: one that leaves
for a resize writes its rank files only, as one that lost a rank does. The last
generation's master merges every generation's files into FILE, on one time axis,
so the trace shows each generation, the commits and the resizes between them.
A generation that loses a rank ends by the MPI killing the others, often before
their exit hook runs; so at every commit an elastic job's rank also appends its
new events to FILE.gen<G>.rank<R>.spool (JSON lines), which the merge reads where
the rank left no file.
"""
from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import re
import signal
import sys
import time

from tarantella.timeline import trace_file
from tarantella.timeline.recorder import Recorder

__all__ = ["start", "recorder", "enabled", "rank_file", "write_rank_file", "finish", "abandon", "merge_rank_files",
           "join_generation", "leave_generation", "spool"]

logger = logging.getLogger("tarantella")

_state: dict = {}
# How long the master waits at exit for the other ranks' files (written at the same moment as its own).
_MERGE_WAIT_SECONDS = 60.0


def enabled() -> bool:
    return bool(_state)


def recorder() -> Recorder | None:
    return _state.get("recorder")


def rank_file(path: str, rank: int, generation: int | None = None) -> str:
    return f"{path}.gen{generation}.rank{rank}.json" if generation else f"{path}.rank{rank}.json"


def _rank_files(path: str) -> list[str]:
    """Every rank file of FILE: a plain job's, and every generation's of an elastic job (its spool files too)."""
    return sorted(glob.glob(glob.escape(path) + ".rank*.json") + glob.glob(glob.escape(path) + ".gen*.rank*.json")
                  + glob.glob(glob.escape(path) + ".gen*.rank*.spool"))


def start(path: str, rank: int, size: int) -> Recorder:
    """Turn the timeline on for this process (idempotent); called by tarantella.init."""
    if _state:
        return _state["recorder"]
    _state.update(recorder=Recorder(), path=os.path.abspath(path), rank=rank, size=size, interrupted=False)
    atexit.register(finish)
    for signum in (signal.SIGINT, signal.SIGTERM):
        _chain_signal(signum)
    return _state["recorder"]


def join_generation(generation: int) -> None:
    """This process is a rank of generation `generation` of an elastic job (Note [Timeline files])."""
    if _state:
        _state["generation"] = generation


def spool() -> None:
    """An elastic job's rank, at a commit: the events since the last spool appended to its spool file."""
    if not _state or not _state.get("generation"):
        return
    record = _state["recorder"]
    events, _state["spooled"] = record.since(_state.get("spooled", 0))
    if events:
        lines = [json.dumps(event) + "\n" for event in
                 trace_file.rank_trace(_state["rank"], events, record.wall_offset)["events"]]
        with open(_spool_file(_state["path"], _state["rank"], _state["generation"]), "a") as handle:
            handle.write("".join(lines))


def _spool_file(path: str, rank: int, generation: int) -> str:
    return f"{path}.gen{generation}.rank{rank}.spool"


def _spooled_trace(name: str) -> dict:
    """A spool file as a trace (a line cut short by the rank's end is left out)."""
    events = []
    with open(name) as handle:
        for line in handle:
            try:
                events.append(tuple(json.loads(line)))
            except ValueError:
                break
    rank = int(re.search(r"\.rank(\d+)\.spool$", name).group(1))
    return trace_file.merge_traces([{"rank": rank, "events": events}])


def leave_generation() -> None:
    """This generation ends for a resize: a later one merges the trace."""
    if _state:
        _state["leaving"] = True


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
    target = rank_file(_state["path"], _state["rank"], _state.get("generation"))
    content = trace_file.merge_traces([_this_rank()])
    trace_file.write_trace(target, content)
    if _state.get("generation"):   # the rank file holds every event: its spool is not needed
        try:
            os.remove(_spool_file(_state["path"], _state["rank"], _state["generation"]))
        except FileNotFoundError:
            pass
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
    generation = _state.get("generation")
    if _state["rank"] != 0 or _state.get("leaving"):
        return
    if _state["size"] == 1 and not generation:
        trace_file.write_trace(_state["path"], trace_file.read_trace(own))
        os.unlink(own)
        return
    expected = [rank_file(_state["path"], rank, generation) for rank in range(_state["size"])]
    deadline = time.monotonic() + (_MERGE_WAIT_SECONDS if clean else 0.0)
    while not all(os.path.exists(name) for name in expected) and time.monotonic() < deadline:
        time.sleep(0.05)
    missing = [name for name in expected if not os.path.exists(name)]
    if missing:
        logger.warning("tarantella: the timeline's rank files %s are missing (a rank failed, or the ranks share "
                       "no file system); once they are all in %s, merge them with `python -m tarantella.timeline "
                       "merge %s`", ", ".join(missing), os.path.dirname(_state["path"]), _state["path"])
        return
    merged = _rank_files(_state["path"])
    merge_rank_files(_state["path"])
    for name in merged:
        os.unlink(name)


def merge_rank_files(path: str) -> tuple[str, int]:
    """Merge FILE.rank*.json (left by a job that did not end cleanly; FILE.gen*.rank*.json: an elastic job's)
    into FILE; (FILE, rank files merged)."""
    found = _rank_files(path)
    if not found:
        raise FileNotFoundError(f"tarantella: no per-rank timeline files {path}.rank<R>.json to merge")
    trace_file.write_trace(path, trace_file.merge_files([_spooled_trace(name) if name.endswith(".spool")
                                                         else trace_file.read_trace(name) for name in found]))
    return path, len(found)
