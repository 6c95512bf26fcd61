"""How much of a step's gradient communication overlapped backprop, from a timeline file alone.

Note [Overlap share]
Per rank and step the timeline has a span `backward` (first gradient op to the
last gradient produced, timed by marks on the gradients themselves) and one
span `allreduce` per gradient bucket (the progress thread's reduction; buckets
that carry only metric state riding with the gradients are left out). The
allreduce busy time is the time covered by at least one of them (their union:
a bucket's span may overlap the next one's while it waits for the peers'
sums). The overlap share of a step is the part of the busy time that lies
before the backward span's end, over the whole busy time: communication done
while backprop still computes is hidden; what runs after the last gradient
exists is exposed. Exposed communication is the time from the last gradient to
the end of the last allreduce. With overlap_communication=False no allreduce
starts before every gradient exists (every start op has a control edge from
every gradient, Note [Start and finish ops are not chained] in
graph_allreduce.py), so the share is 0 there up to clock rounding. (The former
measure took the moment the last bucket was QUEUED as the end of backprop; in
the no-overlap mode the start ops queue buckets one after another after backprop,
so it called a quarter of that mode's communication hidden.)
"""
from __future__ import annotations

import statistics
from typing import Sequence

from tarantella.timeline import names, trace_file

__all__ = ["step_overlap", "overlap_from_trace", "overlap_summary", "communication_profile"]


def step_overlap(allreduce_spans: Sequence[tuple[float, float]], backward_end: float) -> dict:
    """allreduce_spans: (start, end) per bucket; backward_end: when the last gradient was produced (same clock)."""
    busy = _union(allreduce_spans)
    communication = sum(end - start for start, end in busy)
    hidden = sum(max(0.0, min(end, backward_end) - start) for start, end in busy)
    last_end = max((end for _, end in allreduce_spans), default=backward_end)
    return {"buckets": len(allreduce_spans), "communication_s": communication, "hidden_s": hidden,
            "exposed_s": max(0.0, last_end - backward_end),
            "overlap_share": hidden / communication if communication > 0 else 0.0}


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint (start, end) intervals covering the same time as `spans`, in time order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_from_trace(trace: dict | str) -> list[dict]:
    """One row per (rank, step) that has a `backward` span and `allreduce` spans (a trace dict or its file)."""
    trace = trace_file.read_trace(trace) if isinstance(trace, str) else trace
    backward, allreduces = {}, {}
    for event in trace_file.spans(trace):
        key = (event["pid"], event.get("args", {}).get("step"))
        if event["name"] == names.BACKWARD:
            backward[key] = (event["ts"] + event["dur"]) * 1e-6
        elif event["name"] == names.ALLREDUCE and not event.get("args", {}).get("metrics_only"):
            allreduces.setdefault(key, []).append((event["ts"] * 1e-6, (event["ts"] + event["dur"]) * 1e-6))
    rows = []
    for key in sorted(set(backward) & set(allreduces), key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        rows.append({"rank": key[0], "step": key[1], **step_overlap(allreduces[key], backward[key])})
    return rows


def overlap_summary(rows: list[dict], skip_steps: int = 0) -> dict | None:
    """Means over the steps (from `skip_steps` on, e.g. to leave out the tracing step) and ranks."""
    kept = [row for row in rows if row["step"] is None or row["step"] >= skip_steps]
    if not kept:
        return None
    return {"steps": len({row["step"] for row in kept}), "ranks": len({row["rank"] for row in kept}),
            "buckets": kept[-1]["buckets"],
            **{key: statistics.mean(row[key] for row in kept)
               for key in ("communication_s", "hidden_s", "exposed_s", "overlap_share")}}


def communication_profile(bucket_times: Sequence[tuple[float, float, float]]) -> dict:
    """From the reducer's (queued, started, finished) per bucket: buckets and allreduce busy seconds.
    The reducer does not know when backprop ended: the overlap comes from the timeline (overlap_from_trace)."""
    return {"buckets": len(bucket_times),
            "communication_s": sum(finished - started for _, started, finished in bucket_times)}
