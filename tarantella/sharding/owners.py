"""Which rank keeps the optimizer state of which variable (ZeRO's partition of the training state).

Note [Whole variables to owners, balanced by bytes]
Each trainable variable belongs, whole, to one rank: variables are taken from
the largest to the smallest (ties in model order) and each goes to the rank
that owns the fewest bytes so far (ties to the lowest rank), PyTorch's
ZeroRedundancyOptimizer's rule. Whole variables, not DeepSpeed's flat slices,
because a Keras optimizer is per variable: its slots have the variable's shape
(Adafactor factors a matrix by rows and columns, Muon orthogonalises it),
weight decay is excluded by the variable's name, EMA and gradient
accumulation keep one copy per variable. An owner runs the user's unchanged
optimizer on its own variables, so every per-variable rule holds as in serial
Keras. The price is balance: a model dominated by one variable (a large
embedding) cannot be split more finely than it, which `describe` reports; its
transfers, though, are spread over every rank across nodes (Note [Spread
transfers] in spread_transfers.py).
Every rank computes the same assignment from the same model: no message.
"""
from __future__ import annotations

import numpy as np

__all__ = ["assign_owners", "variable_bytes", "describe"]


def variable_bytes(variable) -> int:
    return int(np.prod(tuple(variable.shape), dtype=np.int64)) * np.dtype(variable.dtype).itemsize


def assign_owners(sizes: list[int], ranks: int) -> list[int]:
    """The owning rank of each item of `sizes` (bytes), Note [Whole variables to owners, balanced by bytes]."""
    if ranks < 1:
        raise ValueError(f"tarantella: cannot share variables among {ranks} ranks")
    load = [0] * ranks
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owners[index] = rank
        load[rank] += sizes[index]
    return owners


def describe(sizes: list[int], owners: list[int], ranks: int) -> str:
    """One line: bytes of optimizer-managed weights per rank, and the largest share against an even split."""
    load = [0] * ranks
    for size, owner in zip(sizes, owners):
        load[owner] += size
    even = sum(sizes) / ranks if sizes else 0
    worst = max(load) / even if even else 1.0
    return (f"{len(sizes)} variables over {ranks} ranks, bytes per rank {load} "
            f"(largest share {worst:.2f} x an even split)")
