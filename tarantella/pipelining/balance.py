"""Automatic pipeline cuts for a model without SplitLayers.

The operations, in topological order, are cut into `num_stages` contiguous
runs so that the most expensive stage is as cheap as possible (the pipeline
runs at the pace of its slowest stage). Any contiguous cut of a topological
order is a valid pipeline cut: every tensor crossing it goes straight to its
consumer (Note [Edges go straight to their consumer] in partition.py). The
only constraint is that the model inputs are all read in the first stage.

Cost of an operation: its measured forward+backward time on a synthetic batch
(`measure_costs`), or, where that is impossible (inputs of unknown shape), its
parameter count. Measurement is noisy, so only the master measures and every
rank uses the master's cut.
"""
from __future__ import annotations

import time

import keras
import numpy as np

from tarantella.pipelining.partition import Graph

__all__ = ["parameter_costs", "measure_costs", "balanced_cut", "stages_from_cut", "earliest_cut"]


def parameter_costs(graph: Graph) -> list[float]:
    return [float(sum(int(np.prod(w.shape)) for w in getattr(op, "weights", []))) for op in graph.operations]


def _synthetic_batch(model: keras.Model, batch_size: int):
    arrays = []
    for tensor in keras.tree.flatten(model.input):
        shape = (batch_size,) + tuple(tensor.shape[1:])
        if any(dim is None for dim in shape):
            return None
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        arrays.append(np.zeros(shape, dtype) if "int" in dtype
                      else np.random.default_rng(0).standard_normal(shape).astype(dtype))
    return arrays


def measure_costs(model: keras.Model, graph: Graph, batch_size: int = 16, repeats: int = 3) -> list[float] | None:
    """Seconds per operation (forward + backward, median of `repeats`), or None if the inputs have unknown shape."""
    batch = _synthetic_batch(model, batch_size)
    if batch is None:
        return None
    # Measuring runs the layers (with training=True), which must not move the model's state: BatchNormalization's
    # moving statistics and the random layers' seed states would then start training elsewhere than serial
    # Keras's. In Keras's StatelessScope no Keras variable is assigned.
    with keras.StatelessScope():
        return _measure(model, graph, batch, repeats)


def _measure(model: keras.Model, graph: Graph, batch: list, repeats: int) -> list[float]:
    import tensorflow as tf
    tap_ids = [t for produced in graph.outputs_of for t in produced]
    tap = keras.Model(keras.tree.flatten(model.input), [graph.tensors[t] for t in tap_ids])
    values = dict(zip(tap_ids, tap(batch, training=False)))
    values.update(zip(graph.model_inputs, (tf.convert_to_tensor(a) for a in batch)))
    costs = []
    for operation, consumed, produced in zip(graph.operations, graph.inputs_of, graph.outputs_of):
        if isinstance(operation, keras.layers.InputLayer) or not consumed:
            costs.append(0.0)
            continue
        single = keras.Model([graph.tensors[t] for t in consumed], [graph.tensors[t] for t in produced])
        args = [values[t] for t in consumed]
        samples = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            with tf.GradientTape() as tape:
                tape.watch([a for a in args if a.dtype.is_floating])
                out = single(args, training=True)
                total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in keras.tree.flatten(out)])
            tape.gradient(total, single.trainable_variables + [a for a in args if a.dtype.is_floating])
            samples.append(time.perf_counter() - start)
        costs.append(float(np.median(samples[1:])))
    return costs


def earliest_cut(graph: Graph) -> int:
    """The first position a cut may take: after the last operation that reads a model input."""
    model_inputs = set(graph.model_inputs)
    last_reader = max((i for i, consumed in enumerate(graph.inputs_of) if model_inputs & set(consumed)), default=0)
    return last_reader + 1


def balanced_cut(costs: list[float], num_stages: int, first_allowed: int = 1) -> list[int]:
    """Positions p_1 < ... < p_{S-1} (stage k = operations [p_k, p_{k+1})) minimising the largest stage
    cost, each stage non-empty and p_1 >= first_allowed. Exact dynamic programme, O(S n^2)."""
    n = len(costs)
    if num_stages == 1:
        return []
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    # best[k][i]: the least bottleneck for the first i operations in k stages; cut_at[k][i]: where stage k starts.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut_at = [[0] * (n + 1) for _ in range(num_stages + 1)]
    for i in range(1, n + 1):
        best[1][i] = prefix[i]
    for k in range(2, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(max(k - 1, first_allowed), i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut_at[k][i] = value, j
    if best[num_stages][n] == inf:
        raise ValueError(f"tarantella: cannot cut {n} operations into {num_stages} non-empty pipeline stages "
                         f"with all model inputs read in the first stage; use fewer stages")
    cuts, i = [], n
    for k in range(num_stages, 1, -1):
        i = cut_at[k][i]
        cuts.append(i)
    return cuts[::-1]


def stages_from_cut(num_operations: int, cuts: list[int]) -> list[int]:
    stages, stage = [], 0
    for position in range(num_operations):
        while stage < len(cuts) and position >= cuts[stage]:
            stage += 1
        stages.append(stage)
    return stages
