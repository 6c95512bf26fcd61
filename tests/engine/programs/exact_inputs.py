"""Inputs whose allreduce is exact in every dtype, and its expected result; shared by the check programs."""
import numpy as np


def contribution(length, dtype, r):
    """Small integers: every sum is exact in every dtype, so results compare exactly."""
    values = (np.arange(length, dtype=np.int64) * 7 + r * 3) % 11 - 5
    return values.astype(dtype)


def expected(length, dtype, op, size):
    """What allreduce(contribution(length, dtype, r), op) gives over ranks r = 0..size-1."""
    stacked = np.stack([contribution(length, np.float64, r) for r in range(size)]) if length else np.zeros((size, 0))
    if op == "sum":
        result = stacked.sum(axis=0)
    elif op == "average":
        total = stacked.sum(axis=0)
        result = np.trunc(total / size) if np.issubdtype(np.dtype(dtype), np.integer) else total / size
    elif op == "min":
        result = stacked.min(axis=0)
    else:
        result = stacked.max(axis=0)
    return result.astype(dtype)
