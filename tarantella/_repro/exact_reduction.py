"""Exact mode: gradient sums whose bits do not depend on the rank count.

Note [Exact mode]
A global batch of B samples is cut into V virtual micro-batches of B/V samples
(V a power of two, fixed for the job, independent of the rank count P). The
gradient of the global batch's loss is the sum of the V micro-batch gradients
(each of the micro-batch's mean loss times (B/V)/B), added in one fixed binary
tree: leaves 0..V-1 in order, pairs of neighbours at every level,
((g0+g1)+(g2+g3))+... With P ranks (any 1 <= P <= V), rank r holds the
contiguous, aligned block of micro-batches where the engine's recursive
doubling puts it in that tree (Note [Exact mode's blocks] in
tarantella/data/exact_blocks.py; the V/P micro-batches [r*V/P, (r+1)*V/P)
when P is a power of two), which is exactly the slice tarantella.data gives
it. It sums its block with the same tree, which yields the subtree rooted over
that block, and the engine's recursive-doubling allreduce then adds the ranks'
subtrees: first a folded pair's (P not a power of two), then, at step `mask`,
rank r's partial sum and rank (r xor mask)'s, i.e. it builds the top levels of
the same tree (IEEE addition is commutative bit for bit, so both partners get
the same bits; Note [Bitwise identical results] in
csrc/engine/allreduce.hpp). Every micro-batch gradient is computed by the same
ops on the same shapes from the same weights, so the leaves are bitwise equal
too: the sum, and every weight after it, has the same bits for P = 1, 2, 3,
..., V.

Layers that look at the batch: BatchNormalization normalises each virtual
micro-batch with its own statistics and takes one moving-average step per
global batch from their fixed-tree sum (Note [BatchNormalization in exact
mode] in tarantella/_repro/exact_batch_norm.py); random layers draw each
sample's serial values from the step's seed state (Note [Random values by
sample, not by rank]). Both give the same bits at every P. Every global
batch, including a last partial one, must hold a multiple of V samples.
Summation inside one micro-batch (the batch dimension of a matmul, the loss
mean) is left to the kernels: it is the same at every P because the shapes
are, and it needs the same thread counts (tarantella/determinism.py).

This module is backend-neutral (numbers, numpy arrays, tf tensors: anything
with `+`); the TensorFlow train step is tarantella/_repro/exact_train_step.py.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from tarantella.data.exact_blocks import check_decomposition, is_power_of_two, rank_blocks

__all__ = ["check_decomposition", "rank_blocks", "virtual_batch_size", "tree_sum", "tree_sum_lists",
           "ranks_tree_sum"]

T = TypeVar("T")


def virtual_batch_size(global_batch: int, virtual_batches: int) -> int:
    """Samples per virtual micro-batch; the global batch must split evenly."""
    if global_batch % virtual_batches:
        raise ValueError(f"tarantella exact mode: a global batch of {global_batch} samples does not split into "
                         f"{virtual_batches} equal virtual micro-batches; use a global batch size (and a "
                         f"dataset length, or drop_remainder=True) that is a multiple of {virtual_batches}")
    return global_batch // virtual_batches


def tree_sum(values: Sequence[T], add: Callable[[T, T], T] = lambda a, b: a + b) -> T:
    """Sum of a power-of-two number of values in the fixed pairwise tree of Note [Exact mode]."""
    if not values or not is_power_of_two(len(values)):
        raise ValueError(f"tree_sum needs a power-of-two number of values, got {len(values)}")
    level = list(values)
    while len(level) > 1:
        level = [add(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def tree_sum_lists(per_batch: Sequence[Sequence[T]], add: Callable[[T, T], T] = lambda a, b: a + b) -> list[T]:
    """Given, per virtual micro-batch, a list of gradients (one per variable),
    the per-variable tree sums."""
    if not per_batch:
        raise ValueError("tree_sum_lists needs at least one micro-batch")
    count = len(per_batch[0])
    if any(len(gradients) != count for gradients in per_batch):
        raise ValueError("every micro-batch must have one gradient per variable")
    return [tree_sum([gradients[i] for gradients in per_batch], add) for i in range(count)]


def ranks_tree_sum(values: Sequence[T], add: Callable[[T, T], T] = lambda a, b: a + b) -> T:
    """The sum of one value per rank (any count) in the order the engine's recursive doubling adds them: the
    first 2*rem values pairwise (rem = count minus the largest power of two in it), then the tree of the rest
    (Note [Folding to a power of two] in csrc/engine/power_of_two_fold.hpp)."""
    if not values:
        raise ValueError("ranks_tree_sum needs at least one value")
    core = 1 << (len(values).bit_length() - 1)
    remainder = len(values) - core
    folded = [add(values[2 * i], values[2 * i + 1]) for i in range(remainder)] + list(values[2 * remainder:])
    return tree_sum(folded, add)
