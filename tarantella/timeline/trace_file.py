"""Chrome / Perfetto trace files (JSON trace events) of the timeline.

One process per rank (pid = rank, named "rank R"), one thread track per kind
of work (tid from TRACKS: the training step, the gradient reducer's progress
thread, ...). Times are microseconds since the earliest event of the job on
the wall clock. See Note [Timeline span names] in tarantella/timeline/names.py.
"""
from __future__ import annotations

import json
import os

from tarantella.timeline import names

__all__ = ["rank_trace", "merge_traces", "merge_files", "write_trace", "read_trace", "spans"]


def rank_trace(rank: int, events, wall_offset: float) -> dict:
    """A rank's events as {"rank", "events": [...]} with wall-clock seconds (not yet a trace file)."""
    return {"rank": rank, "events": [(kind, name, track, start + wall_offset, duration, args)
                                     for kind, name, track, start, duration, args in events]}


def merge_traces(ranks: list[dict]) -> dict:
    """One Chrome trace of every rank's events (rank_trace outputs)."""
    starts = [event[3] for rank in ranks for event in rank["events"]]
    origin = min(starts) if starts else 0.0
    trace = []
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        pid = rank["rank"]
        trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tracks = sorted({event[2] for event in rank["events"]}, key=names.track_id)
        for track in tracks:
            tid = names.track_id(track)
            trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
            trace.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for kind, name, track, start, duration, args in rank["events"]:
            event = {"ph": kind, "name": name, "cat": track, "pid": pid, "tid": names.track_id(track),
                     "ts": round((start - origin) * 1e6, 3), "args": dict(args)}
            if kind == "X":
                event["dur"] = round(duration * 1e6, 3)
            else:
                event["s"] = "t"
            trace.append(event)
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"producer": "tarantella timeline", "origin_wall_seconds": origin,
                          "span_names": names.DOCUMENTED}}


def merge_files(traces: list[dict]) -> dict:
    """One trace of several written traces (per-rank files), on the earliest one's time origin."""
    origins = [trace.get("otherData", {}).get("origin_wall_seconds", 0.0) for trace in traces]
    origin = min(origins) if origins else 0.0
    events = []
    for trace, own_origin in zip(traces, origins):
        shift = (own_origin - origin) * 1e6
        for event in trace.get("traceEvents", []):
            if "ts" in event and event.get("ph") != "M":
                event = dict(event, ts=round(event["ts"] + shift, 3))
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "tarantella timeline", "origin_wall_seconds": origin,
                          "span_names": names.DOCUMENTED}}


def write_trace(path: str, content: dict) -> None:
    """Atomically: a reader (or a Ctrl-C during the write) sees the old file or the complete new one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    scratch = f"{path}.writing-{os.getpid()}"
    with open(scratch, "w") as handle:
        json.dump(content, handle)
    os.replace(scratch, path)


def read_trace(path: str) -> dict:
    with open(path) as handle:
        content = json.load(handle)
    return content if isinstance(content, dict) else {"traceEvents": content}


def spans(trace: dict, name: str | None = None) -> list[dict]:
    """The complete ("X") events of a trace, optionally only those called `name`."""
    return [event for event in trace.get("traceEvents", [])
            if event.get("ph") == "X" and (name is None or event.get("name") == name)]
