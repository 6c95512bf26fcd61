"""Exact mode: gradient sums whose bits do not depend on the rank count.

Note [Exact mode]
A global batch of B samples is cut into V virtual micro-batches of B/V samples
(V a power of two, fixed for the job, independent of the rank count P). The
gradient of the global batch's loss is the sum of the V micro-batch gradients
(each of the micro-batch's mean loss times (B/V)/B), added in one fixed binary
tree: leaves 0..V-1 in order, pairs of neighbours at every level,
((g0+g1)+(g2+g3))+... With P ranks (P a power of two dividing V), rank r
holds the contiguous, aligned block of micro-batches [r*V/P, (r+1)*V/P) (that
is exactly the contiguous slice tarantella.data gives it when V divides B), sums
its block with the same tree, which yields the subtree rooted over that block,
and the engine's recursive-doubling allreduce then adds the ranks' subtrees
pairwise: step `mask` adds rank r's partial sum to rank (r xor mask)'s, i.e.
it builds the top log2(P) levels of the same tree (IEEE addition is
commutative bit for bit, so both partners get the same bits; Note [Bitwise
identical results] in csrc/engine/allreduce.hpp). Every micro-batch gradient
is computed by the same ops on the same shapes from the same weights, so the
leaves are bitwise equal too: the sum, and every weight after it, has the same
bits for P = 1, 2, 4, ..., V.

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

__all__ = ["is_power_of_two", "check_decomposition", "virtual_batch_size", "rank_block",
           "tree_sum", "tree_sum_lists"]

T = TypeVar("T")


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_decomposition(virtual_batches: int, size: int) -> None:
    """V and P must be powers of two with P <= V (Note [Exact mode]); user errors otherwise."""
    if not is_power_of_two(virtual_batches):
        raise ValueError(f"tarantella exact mode: the number of virtual micro-batches must be a power of two, "
                         f"got {virtual_batches}; set TNT_EXACT_VIRTUAL_BATCHES to 1, 2, 4, 8, ...")
    if not is_power_of_two(size) or size > virtual_batches:
        raise ValueError(f"tarantella exact mode: the rank count must be a power of two no larger than the "
                         f"{virtual_batches} virtual micro-batches, got {size} ranks; run on 1, 2, 4, ... "
                         f"ranks or raise TNT_EXACT_VIRTUAL_BATCHES")


def virtual_batch_size(global_batch: int, virtual_batches: int) -> int:
    """Samples per virtual micro-batch; the global batch must split evenly."""
    if global_batch % virtual_batches:
        raise ValueError(f"tarantella exact mode: a global batch of {global_batch} samples does not split into "
                         f"{virtual_batches} equal virtual micro-batches; use a global batch size (and a "
                         f"dataset length, or drop_remainder=True) that is a multiple of {virtual_batches}")
    return global_batch // virtual_batches


def rank_block(virtual_batches: int, size: int, rank: int) -> range:
    """The virtual micro-batches rank `rank` of `size` holds: a contiguous, aligned block."""
    check_decomposition(virtual_batches, size)
    per_rank = virtual_batches // size
    return range(rank * per_rank, (rank + 1) * per_rank)


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
