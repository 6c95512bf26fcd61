"""Per fit step: the step, its backward pass, optimizer update and the reducers' buckets, as timeline events.

A Keras callback (added by tnt.Model.fit while the timeline is on) reads after
each train batch what the step noted in-graph (graph_marks) and what the
engine's reducers timed for their buckets (FusedReducer::last_step_times,
placed on this process's clock with the reducer's clock_origin). Nothing of
this runs inside the compiled step. With steps_per_execution > 1 the reducers
report only the last step of a call.
"""
from __future__ import annotations

import time

import keras

from tarantella.timeline import graph_marks, names, session

__all__ = ["TimelineCallback", "record_step"]


def record_step(step: int, begin: float, end: float, marks, allreducers) -> None:
    """Turn one step's marks and reducer times into events of this rank's recorder.
    allreducers: (purpose, GraphAllreducer) pairs; purposes "gradients..." and "metrics"."""
    recorder = session.recorder()
    recorder.complete(names.STEP, "step", begin, end, step=step)
    by_event: dict[str, list[float]] = {}
    for event, when in marks:
        if begin <= when <= end:
            by_event.setdefault(event, []).append(when)
    gradients = by_event.get(graph_marks.GRADIENT, [])
    if gradients:
        first = min(by_event.get(graph_marks.LOSS, gradients))
        recorder.complete(names.BACKWARD, "step", first, max(gradients), step=step, gradients=len(gradients))
    reduced, updated = by_event.get(graph_marks.REDUCED, []), by_event.get(graph_marks.UPDATED, [])
    if reduced and updated:
        recorder.complete(names.OPTIMIZER, "step", min(reduced), max(updated), step=step)
    own, handed = by_event.get(graph_marks.OWN_UPDATES, []), by_event.get(graph_marks.HANDED_OVER, [])
    if own and handed:
        recorder.complete(names.WEIGHT_HANDOFF, "step", min(own), max(handed), step=step, transfers=len(handed))
    moved = by_event.get(graph_marks.TO_OWNER, [])
    if moved:
        recorder.complete(names.GRADIENTS_TO_OWNERS, "step", min(moved), max(moved), step=step, transfers=len(moved))
    gathered = by_event.get(graph_marks.GATHERED, [])
    if gathered:
        recorder.complete(names.WEIGHT_GATHERS, "step", min(gathered), max(gathered), step=step,
                          transfers=len(gathered))
    # The statistics allreduces run one at a time in one order (in_graph_sum.py): the k-th
    # input and the k-th sum of the step belong together.
    sent = sorted(by_event.get(graph_marks.STATISTICS_SENT, []))
    summed = sorted(by_event.get(graph_marks.STATISTICS_SUMMED, []))
    for index, (start, finish) in enumerate(zip(sent, summed)):
        recorder.complete(names.STATISTICS_ALLREDUCE, "statistics", start, finish, step=step, index=index)
    # Buckets of a gradient reducer that carry only metric state (Note [Metric state rides with the gradients]):
    # their `allreduce` spans say so (metrics_only), and the overlap of the gradients leaves them out.
    metric_only = {id(view.gradient_allreducer): view.metric_only_buckets for _, view in allreducers
                   if hasattr(view, "metric_only_buckets")}
    for purpose, allreducer in allreducers:
        track, span = ("metrics", names.METRIC_ALLREDUCE) if purpose == "metrics" else ("reducer", names.ALLREDUCE)
        only_metrics = metric_only.get(id(allreducer), frozenset()) if track == "reducer" else frozenset()
        try:
            origin, times, sizes = allreducer.clock_origin(), allreducer.last_step_times(), allreducer.bucket_bytes()
        except (RuntimeError, ValueError):  # a closed reducer
            continue
        for bucket, ((queued, started, finished), size) in enumerate(zip(times, sizes)):
            if not begin <= origin + started <= end:  # this reducer did not run in this step
                continue
            if track == "reducer":
                recorder.instant(names.BUCKET_READY, track, origin + queued, step=step, bucket=bucket)
            marked = {"metrics_only": True} if bucket in only_metrics else {}
            recorder.complete(span, track, origin + started, origin + finished, step=step, bucket=bucket, bytes=size,
                              **marked)


class TimelineCallback(keras.callbacks.Callback):
    """Records each train batch of a tnt.Model on the timeline; `allreducers()` gives the model's reducers."""

    def __init__(self, allreducers):
        super().__init__()
        self._allreducers = allreducers
        self._begin = 0.0
        self._step = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        end = time.monotonic()
        marks = graph_marks.drain()
        record_step(self._step, self._begin, end, marks, self._allreducers())
        self._step += 1
