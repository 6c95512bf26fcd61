"""Global batches and their per-rank micro-batches: the arithmetic, nothing else.

Every global batch (of any size, including a partial last one) is split into
`size` contiguous micro-batches: rank r gets `global // size` samples, plus one
if `r < global % size`, starting where rank r-1's ended. So concatenating the
ranks' micro-batches in rank order gives back the global batch, and a global
batch smaller than the rank count leaves the last ranks empty (they take part
with zero samples and zero weight). In tnt-repro's exact mode a global batch of a
multiple of its virtual micro-batches is split at their blocks' edges instead
(Note [Exact mode's blocks] in exact_blocks.py).
"""
from __future__ import annotations

import math

import numpy as np

from tarantella.data import exact_blocks

__all__ = ["micro_batch_size", "micro_batch_offset", "check_global_batch_size", "global_batch_sizes",
           "rank_sample_indices", "validation_split_at"]


def micro_batch_size(global_batch: int, size: int, rank: int) -> int:
    """Samples rank `rank` (of `size`) processes from a global batch of `global_batch`."""
    blocks = exact_blocks.block_bounds(global_batch, size, rank)
    if blocks is not None:
        return blocks[1]
    return global_batch // size + (1 if rank < global_batch % size else 0)


def micro_batch_offset(global_batch: int, size: int, rank: int) -> int:
    """Index, inside the global batch, of rank `rank`'s first sample."""
    blocks = exact_blocks.block_bounds(global_batch, size, rank)
    if blocks is not None:
        return blocks[0]
    return rank * (global_batch // size) + min(rank, global_batch % size)


def check_global_batch_size(global_batch: int, size: int, what: str = "batch_size") -> None:
    """A global batch must give every rank at least one sample (a partial last batch may not)."""
    if global_batch < size:
        raise ValueError(
            f"tarantella: the global {what} is {global_batch} but the job has {size} ranks, so some ranks "
            f"would get no samples in every step; `{what}` is the GLOBAL batch size (all ranks together): "
            f"set it to at least {size}, or run on fewer ranks")


def global_batch_sizes(num_samples: int, global_batch: int) -> list[int]:
    """The sizes of the global batches of an epoch over `num_samples` samples, the last one partial."""
    full, rest = divmod(num_samples, global_batch)
    return [global_batch] * full + ([rest] if rest else [])


def rank_sample_indices(num_samples: int, global_batch: int, size: int, rank: int) -> np.ndarray:
    """Positions (in epoch order) of the samples rank `rank` processes, batch after batch."""
    pieces = []
    for batch, batch_size in enumerate(global_batch_sizes(num_samples, global_batch)):
        start = batch * global_batch + micro_batch_offset(batch_size, size, rank)
        pieces.append(np.arange(start, start + micro_batch_size(batch_size, size, rank), dtype=np.int64))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def validation_split_at(num_samples: int, validation_split: float) -> int:
    """Where Keras splits arrays for `validation_split`: samples [0, at) train, [at, n) validate."""
    if not 0.0 < validation_split < 1.0:
        raise ValueError(f"validation_split must be between 0 and 1 (exclusive), got {validation_split}")
    at = int(math.floor(num_samples * (1.0 - validation_split)))
    if at == 0 or at == num_samples:
        raise ValueError(f"validation_split={validation_split} leaves no samples for training or validation "
                         f"out of {num_samples}")
    return at
