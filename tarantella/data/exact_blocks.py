"""Which part of a global batch each rank computes in tnt-repro's exact mode (Note [Exact mode's blocks]).

Note [Exact mode's blocks]
Exact mode (Note [Exact mode] in tarantella/_repro/exact_reduction.py) cuts a global batch into V virtual
micro-batches (V a power of two) and sums their gradients in one fixed binary tree; the ranks' sums are added
by the engine's recursive doubling. That allreduce adds the ranks' values in a binary tree of its own: with
P = 2^k + rem ranks it first folds the first 2*rem ranks pairwise (0 with 1, 2 with 3, ...: Note [Folding to
a power of two] in csrc/engine/power_of_two_fold.hpp), then combines the 2^k "core" values pairwise by rank
bits. For the two trees to be one, each rank must hold the subtree of leaves the engine's tree puts it at:
core c holds the aligned block of V/2^k virtual micro-batches starting at c*V/2^k; a folded pair splits its
core's block in halves, the even rank the first. So P need not be a power of two: any 1 <= P <= V works
(V >= 2^(k+1) when P is not a power of two, which P <= V gives). At P = 3, V = 4 the blocks are [0], [1],
[2, 3], summed ((g0 + g1) + (g2 + g3)), as one rank sums them. The blocks are unequal then (the folded ranks
compute half as much), the price of bitwise equality at every rank count.

The data layer gives each rank its block's samples (batching.py, distributed_dataset.py): a global batch of a
multiple of V samples is split at the blocks' edges; any other (a validation remainder; exact mode refuses
such a training batch) is split evenly as always. At P a power of two the blocks are the even split.
"""
from __future__ import annotations

import os

__all__ = ["VIRTUAL_BATCHES_VARIABLE", "virtual_batches_from_environment", "is_power_of_two",
           "check_decomposition", "rank_blocks", "block_bounds"]

VIRTUAL_BATCHES_VARIABLE = "TNT_EXACT_VIRTUAL_BATCHES"


def virtual_batches_from_environment() -> int | None:
    """V from TNT_EXACT_VIRTUAL_BATCHES; None (exact mode off) when unset or empty."""
    raw = os.environ.get(VIRTUAL_BATCHES_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"tarantella exact mode: {VIRTUAL_BATCHES_VARIABLE}={raw!r} is not a whole number; "
                         f"set it to a power of two such as 4") from None


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_decomposition(virtual_batches: int, size: int) -> None:
    """V must be a power of two and P at most V (Note above); user errors otherwise."""
    if not is_power_of_two(virtual_batches):
        raise ValueError(f"tarantella exact mode: the number of virtual micro-batches must be a power of two, "
                         f"got {virtual_batches}; set {VIRTUAL_BATCHES_VARIABLE} to 1, 2, 4, 8, ...")
    if not 1 <= size <= virtual_batches:
        raise ValueError(f"tarantella exact mode: every rank needs a virtual micro-batch, but {size} ranks share "
                         f"{virtual_batches}; run on at most {virtual_batches} ranks or raise "
                         f"{VIRTUAL_BATCHES_VARIABLE} to a power of two >= {size}")


def rank_blocks(virtual_batches: int, size: int) -> list[range]:
    """Per rank, the contiguous block of virtual micro-batches it holds, where the engine's recursive doubling
    (with its fold) puts it in the tree."""
    check_decomposition(virtual_batches, size)
    core = 1 << (size.bit_length() - 1)       # 2^k <= size
    remainder = size - core
    leaves = virtual_batches // core          # per core rank
    blocks = []
    for c in range(core):
        start = c * leaves
        if c < remainder:                     # a folded pair: ranks 2c and 2c+1 split the core's block
            blocks += [range(start, start + leaves // 2), range(start + leaves // 2, start + leaves)]
        else:
            blocks.append(range(start, start + leaves))
    return blocks


def block_bounds(global_batch: int, size: int, rank: int) -> tuple[int, int] | None:
    """(offset, count) of rank `rank`'s samples in a global batch under exact mode's blocks; None when exact
    mode is off, on one rank, or the batch is no multiple of V (then the batch is split evenly)."""
    virtual_batches = virtual_batches_from_environment()
    if not virtual_batches or size == 1 or global_batch % virtual_batches:
        return None
    block = rank_blocks(virtual_batches, size)[rank]
    piece = global_batch // virtual_batches
    return block.start * piece, len(block) * piece
