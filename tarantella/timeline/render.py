"""A picture of one training step of a timeline file: the same events Perfetto shows, drawn with matplotlib.

    python -m tarantella.timeline render TRACE.json OUT.png [--step N]

One row per rank and track (Note [Timeline span names]), time in milliseconds
from the step's start on the earliest rank; each span of the step a bar
coloured by its name, each instant (bucket_ready) a tick; wide buckets carry
their id. The
title gives the step's overlap share and exposed communication per rank
(Note [Overlap share] in tarantella/timeline/overlap.py). matplotlib is an
optional dependency (tarantella[bench]); without it the command says how to
install it.
"""
from __future__ import annotations

from tarantella.timeline import names, trace_file

__all__ = ["render_step", "step_window", "RenderError"]

# Span name -> colour; other names share the last one.
_COLOURS = {names.STEP: "#d9d9d9", names.BACKWARD: "#4c72b0", names.OPTIMIZER: "#55a868",
            names.ALLREDUCE: "#dd8452", names.METRIC_ALLREDUCE: "#c44e52", None: "#8172b2"}


class RenderError(ValueError):
    """The trace has nothing to draw for the step asked for."""


def _steps(trace: dict) -> list[int]:
    return sorted({event["args"]["step"] for event in trace_file.spans(trace, names.STEP)
                   if isinstance(event.get("args", {}).get("step"), int)})


def step_window(trace: dict, step: int | None = None) -> tuple[int, float, float]:
    """(step, first start, last end) in trace microseconds of the `train_step` spans of `step` over all
    ranks; step None: the last step every rank recorded (the most warmed-up one)."""
    steps = _steps(trace)
    if not steps:
        raise RenderError("the trace has no `train_step` spans: record it with `tarantella --timeline FILE` "
                          "around a tnt.Model fit")
    if step is None:
        ranks = {event["pid"] for event in trace_file.spans(trace, names.STEP)}
        common = [s for s in steps if all(any(e["pid"] == r and e["args"].get("step") == s
                                              for e in trace_file.spans(trace, names.STEP)) for r in ranks)]
        step = (common or steps)[-1]
    spans = [event for event in trace_file.spans(trace, names.STEP) if event["args"].get("step") == step]
    if not spans:
        raise RenderError(f"the trace has no step {step}; it has steps {steps[0]}..{steps[-1]}")
    return step, min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)


def _rows(trace: dict) -> list[tuple[int, int, str]]:
    """(pid, tid, label) per rank and track that has events, ranks in order, tracks in Note order."""
    labels = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace.get("traceEvents", [])
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in trace.get("traceEvents", []) if e.get("ph") in ("X", "i")}
    return [(pid, tid, f"rank {pid} {labels.get((pid, tid), tid)}") for pid, tid in sorted(used)]


def _title(trace: dict, step: int) -> str:
    from tarantella.timeline.overlap import overlap_from_trace
    rows = [row for row in overlap_from_trace(trace) if row["step"] == step]
    parts = [f"rank {row['rank']}: overlap share {row['overlap_share']:.0%}, exposed "
             f"{row['exposed_s'] * 1e3:.1f} ms of {row['communication_s'] * 1e3:.1f} ms" for row in rows]
    return f"step {step}" + (" - " + "; ".join(parts) if parts else "")


def render_step(trace: dict | str, output: str, step: int | None = None, width_inches: float = 14.0) -> int:
    """Draw `step` of the trace (a dict or its file) into `output` (any matplotlib format, by suffix);
    returns the step drawn."""
    trace = trace_file.read_trace(trace) if isinstance(trace, str) else trace
    step, begin, end = step_window(trace, step)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RenderError("rendering a timeline needs matplotlib: pip install matplotlib "
                          "(or tarantella[bench])") from None
    margin = 0.02 * (end - begin)
    low, high = begin - margin, end + margin
    rows = _rows(trace)
    position = {(pid, tid): len(rows) - 1 - index for index, (pid, tid, _) in enumerate(rows)}
    figure, axis = plt.subplots(figsize=(width_inches, 0.9 + 0.45 * len(rows)))
    seen, labelled = set(), {}  # legend entries drawn; per row, the x of each bucket label
    for event in trace.get("traceEvents", []):
        key = (event.get("pid"), event.get("tid"))
        if event.get("ph") not in ("X", "i") or key not in position:
            continue
        start = event["ts"]
        finish = start + event.get("dur", 0.0)
        if finish < low or start > high or event.get("args", {}).get("step", step) != step:
            continue  # another step's events (ranks drift apart) stay out of the picture
        y = position[key]
        x0, x1 = (max(start, low) - begin) / 1e3, (min(finish, high) - begin) / 1e3
        name = event["name"]
        if event["ph"] == "i":
            axis.plot([x0, x0], [y - 0.4, y + 0.4], color="black", linewidth=0.8,
                      label=None if name in seen else name)
            seen.add(name)
            continue
        colour = _COLOURS.get(name, _COLOURS[None])
        nested = name != names.STEP  # the step span is the background of its track
        height = 0.6 if nested else 0.8
        axis.barh(y, x1 - x0, left=x0, height=height, color=colour, edgecolor="black", linewidth=0.3,
                  label=None if name in seen else name, zorder=2 if nested else 1)
        seen.add(name)
        bucket = event.get("args", {}).get("bucket")
        room = 0.04 * (high - low) / 1e3
        centre = (x0 + x1) / 2
        if bucket is not None and x1 - x0 > room and all(abs(centre - c) > room for c in labelled.get(y, [])):
            labelled.setdefault(y, []).append(centre)
            axis.text(centre, y, str(bucket), ha="center", va="center", fontsize=7, zorder=3)
    axis.set_yticks([position[(pid, tid)] for pid, tid, _ in rows], [label for _, _, label in rows])
    axis.set_xlim((low - begin) / 1e3, (high - begin) / 1e3)
    axis.set_xlabel("ms since the step began (earliest rank)")
    axis.set_title(_title(trace, step), fontsize=9)
    axis.grid(axis="x", linewidth=0.3)
    axis.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(output, dpi=150)
    plt.close(figure)
    return step
