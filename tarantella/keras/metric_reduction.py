"""Global metric values: sum the metric STATE (totals, counts, confusion
matrices) over the ranks, then compute each metric's result from the summed
state with `Metric.stateless_result`. Averaging per-rank results would be wrong
whenever ranks hold different numbers of samples.

This assumes additive metric state, which holds for every built-in Keras
metric (they keep sums and counts); a custom metric whose state is, e.g., a
running maximum would need its own reduction.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import collectives

__all__ = ["metric_variables", "results_from_state", "eager_global_results", "graph_global_results"]


def metric_variables(metrics) -> list:
    return [variable for metric in metrics for variable in metric.variables]


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


def eager_global_results(metrics) -> dict:
    """Collective, outside tf.function (Keras calls get_metrics_result so at the end of an epoch)."""
    values = [np.asarray(variable.numpy()) for variable in metric_variables(metrics)]
    summed = [collectives.allreduce(value) if value.size else value for value in values]
    return results_from_state(metrics, [tf.convert_to_tensor(value) for value in summed])


def graph_global_results(metrics, allreducer_for) -> dict:
    """Inside a traced step: `allreducer_for(tensors)` gives the GraphAllreducer for these tensors."""
    values = [tf.convert_to_tensor(variable) for variable in metric_variables(metrics)]
    summed = allreducer_for(values)(values) if values else []
    return results_from_state(metrics, summed)
