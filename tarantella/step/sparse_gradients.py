"""Sparse gradients of per-sample lookups (embeddings) gathered over the ranks, as serial Keras sees them.

Note [Sparse gradients stay sparse]
The gradient of an Embedding (a gather) is a tf.IndexedSlices with ONE slice
per lookup: a token that occurs k times in the batch has k slices with the same
index. Keras 3 optimizers do not merge them first: Adam and RMSprop square the
slices' values one by one (`ops.square` on IndexedSlices squares `values`) and
only then add them into their dense state, so a row's second moment grows by
sum_i g_i^2 over its slices, not by (sum_i g_i)^2. Summing every rank's
gradient densely (what the fused reducer does for all other gradients) gives
(sum_i g_i)^2 for the rows two ranks both touched: serial and N ranks drift
apart at the first such row (measured 1e-2 after two epochs with Adam).

So a sparse gradient whose indices come from the samples (a lookup per sample)
is not made dense: every rank sends its slices (indices, and values already
weighted by its share n_r / N) and receives every rank's, concatenated in rank
order. Micro-batches are contiguous pieces of the global batch in rank order
(tarantella/data/batching.py), so the result is serial's IndexedSlices of the
global batch, slice for slice and in serial's order. A rank with no samples
sends none.

A sparse gradient whose indices do NOT come from the samples (the position
embedding of `ops.arange(0, length)`) has the same indices on every rank and
each slice already sums over the rank's samples: serial's slices are the sums
of the ranks' slices, so it is summed densely in the fused reducer like any
other gradient (its indices are distinct, so dense and sparse updates agree).
"Comes from the samples": the indices depend on the step's input data through
ops other than Shape/Size/Rank (found by walking the traced graph).

The gather runs as one `tf.numpy_function` per apply (one collective on its own
communicator, so it never interleaves with the reducer's progress thread; the
gathers of one traced function are chained so that every rank runs them in the
same order). It is Python on the step's path, the price of serial's result;
models without embeddings never build it.

Note [A blocking gather waits for the step's transfers]
The gather blocks the TensorFlow thread that runs it until every rank has
called it. With one inter-op thread (TF_NUM_INTEROP_THREADS=1, or TensorFlow's
own default on a one-CPU rank) that thread is the rank's whole executor: ops
that became ready while it waits do not run. shard="weights" hung that way
(an Embedding and attention, 2 ranks): rank 1 owns dense_5 and computes its
forward from its own copy, so its executor reached the embedding's gather in
the backward pass before running the forward sends of dense_5's weights,
ready but queued; rank 0 waited for those weights in its forward pass and
never reached its gather. So a sharded step's gather starts only once this
rank's counted transfers (SendCounter, tarantella/sharding/send_counter.py)
are complete: a rank inside the gather then owes no peer a transfer, and a
peer outside it can finish its own and come in.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import collectives

__all__ = ["is_per_sample", "gather"]

_SHAPE_ONLY = {"Shape", "ShapeN", "Size", "Rank", "VariableShape"}
_INPUT_DATA = {"IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "IteratorGetNextAsOptional"}
_group: collectives.Group | None = None


def is_per_sample(gradient) -> bool:
    """A tf.IndexedSlices whose indices depend on the step's input samples (see the Note)."""
    if not isinstance(gradient, tf.IndexedSlices) or not hasattr(gradient.indices, "graph"):
        return False
    graph = gradient.indices.graph
    captured = {id(internal) for _, internal in getattr(graph, "captures", [])}
    stack, seen = [gradient.indices.op], set()
    while stack:
        op = stack.pop()
        if op.name in seen or op.type in _SHAPE_ONLY:
            continue
        seen.add(op.name)
        if op.type in _INPUT_DATA:
            return True
        if op.type == "Placeholder":
            output = op.outputs[0]
            if output.dtype != tf.resource and id(output) not in captured:
                return True  # an argument of the traced step: its data
            continue
        stack.extend(tensor.op for tensor in op.inputs)
        stack.extend(op.control_inputs)
    return False


def _world_copy() -> collectives.Group:
    """A communicator of its own for the gathers (created collectively while tracing, on first use)."""
    global _group
    if _group is None:
        _group = collectives.Group.world().split(0)
    return _group


def gather(gradients: list[tf.IndexedSlices], variables, share, after=()) -> list[tf.IndexedSlices]:
    """Every rank's slices of each gradient, concatenated in rank order (call while tracing, on every rank).
    `share` weights this rank's values (None: already weighted); a rank with share 0 sends no slices. The
    gather starts once the tensors `after` exist (Note [A blocking gather waits for the step's transfers])."""
    group = _world_copy()
    parts = []
    for gradient in gradients:
        indices, values = gradient.indices, gradient.values
        if share is not None:
            keep = tf.where(share > 0, tf.shape(indices)[0], 0)
            indices, values = indices[:keep], values[:keep] * tf.cast(share, values.dtype)
        parts += [indices, values]
    graph = tf.compat.v1.get_default_graph()
    previous = getattr(graph, "_tnt_last_sparse_gather", None)
    with tf.control_dependencies(list(after) + ([] if previous is None else [previous])):
        gathered = tf.numpy_function(lambda *arrays: _allgather(group, arrays), parts,
                                     [part.dtype for part in parts], stateful=True, name="TntGatherSparseGradients")
    graph._tnt_last_sparse_gather = gathered[0]
    result = []
    for number, (gradient, variable) in enumerate(zip(gradients, variables)):
        indices, values = gathered[2 * number], gathered[2 * number + 1]
        indices.set_shape([None])
        values.set_shape([None] + gradient.values.shape[1:])
        result.append(tf.IndexedSlices(values, indices, tf.constant(list(variable.shape), tf.int64)))
    return result


def _allgather(group: collectives.Group, arrays) -> list[np.ndarray]:
    every_rank = collectives.allgather_object([np.asarray(array) for array in arrays], group)
    return [np.concatenate([mine[i] for mine in every_rank]) for i in range(len(arrays))]
