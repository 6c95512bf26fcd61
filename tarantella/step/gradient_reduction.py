"""Sum gradients over the ranks, each rank's weighted by its share of the global batch.

One home for the arithmetic that every distributed path uses: tnt.Model's own
train step (through the loss, Note [Loss of the global batch] in tf_steps.py),
the distributed optimizer (Note [Distributing through the optimizer] in
distributed_optimizer.py) and custom loops (tnt.reduce_gradients, custom_loop.py).

Note [16-bit gradients are summed in float32]
Under a mixed-precision policy the variables, and so their gradients, are
float32: the allreduce sums float32 whatever the layers compute in. A variable
that is itself float16 or bfloat16 (the "bfloat16" policy) has 16-bit
gradients; serial Keras rounds each of them once, at the end of the kernel that
sums the batch. Summed over the ranks in 16 bits, every addition would round
again (log2 N more roundings of 2^-8 for bfloat16), so such gradients are
weighted and summed in float32 and rounded to the variable's dtype once, after
the sum: twice their bytes on the wire, serial's single rounding.
"""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tarantella.step import sparse_gradients
from tarantella.timeline import graph_marks

__all__ = ["dense_gradients", "weighted_sum"]

_SUMMED_IN_FLOAT32 = (tf.float16, tf.bfloat16)


def dense_gradients(gradients, variables) -> list[tf.Tensor]:
    """Every gradient as a dense tensor of its VARIABLE's static shape: unconnected variables get zeros,
    sparse ones (embeddings) dense ones. A sparse gradient made dense has a dynamic shape (its dense_shape
    is a tensor), which the allreducer cannot register; the variable's shape is the true one."""
    dense = []
    for gradient, variable in zip(gradients, variables):
        if gradient is None:
            dense.append(tf.zeros(variable.shape, variable.dtype))
            continue
        gradient = tf.convert_to_tensor(gradient)
        if not gradient.shape.is_fully_defined() or gradient.shape != variable.shape:
            gradient = tf.reshape(gradient, variable.shape)
        dense.append(gradient)
    return dense


def weighted_sum(gradients, variables, share, allreducer_for: Callable, overlap: bool = True, to_owners=None) -> list:
    """sum over ranks of share_r * gradient_r, in the order of `variables` (call while tracing).

    `share` is this rank's n_r / N (a scalar tensor), or None when the gradients are already weighted.
    Registered in backprop order (the reverse of the variables) so that buckets fill as backprop runs.
    A rank with share 0 (no samples) contributes exact zeros even if its gradients are not finite.
    Sparse gradients of per-sample lookups come back as the global batch's tf.IndexedSlices, all others
    dense (Note [Sparse gradients stay sparse] in sparse_gradients.py). `to_owners`: a sharding with
    shard="gradients", whose reduce_to_owners sums the dense gradients instead of the allreduce, each on its
    variable's owner: the others get None for it (Note [Gradients summed on their owners])."""
    gradients, variables = list(gradients), list(variables)
    sparse = [i for i, gradient in enumerate(gradients) if sparse_gradients.is_per_sample(gradient)]
    dense_at = [i for i in range(len(gradients)) if i not in sparse]
    result: list = [None] * len(gradients)
    if dense_at:
        dense_variables = [variables[i] for i in dense_at]
        dense = graph_marks.mark_each(dense_gradients([gradients[i] for i in dense_at], dense_variables),
                                      graph_marks.GRADIENT)  # timeline only
        dtypes = [gradient.dtype for gradient in dense]
        dense = [tf.cast(g, tf.float32) if g.dtype in _SUMMED_IN_FLOAT32 else g for g in dense]  # Note above
        if share is not None:
            dense = [_weighted(gradient, share) for gradient in dense]
        in_backprop_order = dense[::-1]
        if to_owners is not None:
            summed = to_owners.reduce_to_owners(in_backprop_order, dense_variables[::-1], overlap=overlap)
        else:
            summed = allreducer_for(in_backprop_order)(in_backprop_order, overlap=overlap)
        summed = [tf.cast(g, dtype) if g is not None and g.dtype != dtype else g
                  for g, dtype in zip(summed[::-1], dtypes)]
        for i, gradient in zip(dense_at, graph_marks.mark_each(summed, graph_marks.REDUCED)):
            result[i] = gradient
    if sparse:
        gathered = sparse_gradients.gather([gradients[i] for i in sparse], [variables[i] for i in sparse], share)
        for i, gradient in zip(sparse, gathered):
            result[i] = gradient
    return result


def _weighted(gradient: tf.Tensor, share) -> tf.Tensor:
    share = tf.cast(share, gradient.dtype)
    return tf.where(share > 0, gradient * share, tf.zeros_like(gradient))
