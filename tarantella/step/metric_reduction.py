"""Global metric values: sum the metric STATE (totals, counts, confusion
matrices) over the ranks, then compute each metric's result from the summed
state with `Metric.stateless_result`. Averaging per-rank results would be wrong
whenever ranks hold different numbers of samples.

This assumes additive metric state, which holds for every built-in Keras
metric (they keep sums and counts); a custom metric whose state is, e.g., a
running maximum would need its own reduction.

Note [Metric state rides with the gradients]
A train step needs two sums over the ranks: the gradients and the metric
state. Reduced one after the other, the metric state is a second allreduce
(its own reducer, progress thread and synchronisation) that starts only
after the gradients', on every step. The state is known once the forward pass
and the metric updates ran, long before backprop ends, so tnt.Model's train
step appends it to the gradient reducer's tensors (`RidingAllreducer`): it
fills the last bucket(s), reduced right behind the last gradients with no
second synchronisation. The state's start ops wait (control edges) for every
gradient: buckets are reduced in the order they were queued (Note [Buckets are
reduced in an agreed order] in csrc/engine/fused_reducer.hpp), and a state
handed over right after the forward pass would put its bucket first, where
the progress thread waits for the slower peer's state from the start of
backprop, holding every gradient bucket behind it. The sums are the same
element-wise sums of the same values (results stay exact). Evaluation has no gradients and keeps its own
metric reduction; the timeline shows the metric buckets of the gradient
reducer on its metrics track (`metric_buckets`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import collectives

__all__ = ["metric_variables", "metric_state", "results_from_state", "eager_global_results", "graph_global_results",
           "RidingAllreducer", "MetricBuckets"]


def metric_variables(metrics) -> list:
    return [variable for metric in metrics for variable in metric.variables]


def metric_state(metrics) -> list[tf.Tensor]:
    """The metric variables' current values, as tensors (read after this step's updates)."""
    return [tf.convert_to_tensor(variable) for variable in metric_variables(metrics)]


def results_from_state(metrics, values) -> dict:
    """Keras's get_metrics_result, computed from `values` (one per metric variable) instead of the variables."""
    results, position = {}, 0
    for metric in metrics:
        count = len(metric.variables)
        result = metric.stateless_result(list(values[position:position + count]))
        position += count
        if isinstance(result, dict):
            results.update(result)
        else:
            results[metric.name] = result
    return results


def _built(metrics) -> list:
    """The metrics that hold a state: a compiled metric that a model's own train_step never updates stays
    unbuilt, and Keras's logs leave it out."""
    return [metric for metric in metrics if getattr(metric, "built", True)]


def eager_global_results(metrics) -> dict:
    """Collective, outside tf.function (Keras calls get_metrics_result so at the end of an epoch)."""
    metrics = _built(metrics)
    values = [np.asarray(variable.numpy()) for variable in metric_variables(metrics)]
    summed = [collectives.allreduce(value) if value.size else value for value in values]
    return results_from_state(metrics, [tf.convert_to_tensor(value) for value in summed])


def graph_global_results(metrics, allreducer_for) -> dict:
    """Inside a traced step: `allreducer_for(tensors)` gives the GraphAllreducer for these tensors."""
    metrics = _built(metrics)
    values = metric_state(metrics)
    summed = allreducer_for(values)(values) if values else []
    return results_from_state(metrics, summed)


class RidingAllreducer:
    """Note [Metric state rides with the gradients]: wraps a step's `allreducer_for(tensors)` so that the
    GraphAllreducer it asks for reduces `tensors` followed by `state`; after the call, `summed_state`
    holds the state's sums. Used while tracing one train step."""

    def __init__(self, allreducer_for, state):
        self._allreducer_for = allreducer_for
        self._state = list(state)
        self.summed_state = None

    def __call__(self, tensors):
        """The allreducer_for callable that gradient_reduction.weighted_sum calls."""
        allreducer = self._allreducer_for(list(tensors) + self._state)

        def reduce(tensors, overlap: bool = True):
            # The state is handed over once every gradient exists (Note above).
            summed = allreducer(list(tensors) + self._state, overlap=overlap, last=len(self._state))
            self.summed_state = summed[len(tensors):]
            return summed[:len(tensors)]

        return reduce


class MetricBuckets:
    """The buckets of a gradient reducer that hold the metric state (its last `state_count` tensors), with
    the GraphAllreducer methods the timeline reads (clock_origin, last_step_times, bucket_bytes)."""

    def __init__(self, allreducer, state_count: int):
        self.gradient_allreducer = allreducer
        tensors = len(allreducer.shapes)
        self._buckets = sorted({allreducer.bucket_of(t) for t in range(tensors - state_count, tensors)})
        gradient_buckets = {allreducer.bucket_of(t) for t in range(tensors - state_count)}
        # Buckets of the gradient reducer holding metric state and no gradient (the timeline's overlap leaves them out).
        self.metric_only_buckets = frozenset(b for b in self._buckets if b not in gradient_buckets)

    def clock_origin(self) -> float:
        return self.gradient_allreducer.clock_origin()

    def last_step_times(self) -> list:
        times = self.gradient_allreducer.last_step_times()
        return [times[b] for b in self._buckets]

    def bucket_bytes(self) -> list[int]:
        sizes = self.gradient_allreducer.bucket_bytes()
        return [sizes[b] for b in self._buckets]
