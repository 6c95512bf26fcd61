"""Helpers shared by the programs that compare tnt.Model with serial Keras in one process."""
import json

import numpy as np

import tarantella as tnt
from tarantella import collectives

RANK, SIZE = tnt.get_rank(), tnt.get_size()


def report(check, **values):
    """One `RESULT <json>` line for the test to read (tests/keras/test_data_parallel.py `results`)."""
    print("RESULT " + json.dumps({"check": check, "rank": RANK, "size": SIZE, **values}), flush=True)


def relative_difference(a, b):
    """max over tensors of max|a-b| / max|a| (scale-relative: elementwise ratios blow up near zero).
    A tensor below 1e-3 everywhere counts as of scale 1e-3: an attention layer's key bias gets a gradient
    that is zero but for rounding, so its values are rounding noise that no two summation orders share."""
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-3)) for x, y in zip(a, b))


def logs_difference(serial, distributed):
    """The largest relative difference between two fit histories, over every logged value."""
    return max(float(np.max(np.abs(np.asarray(v) - np.asarray(distributed.history[k]))
                            / np.maximum(np.abs(np.asarray(v)), 1e-12))) for k, v in serial.history.items())


def elementwise_difference(a, b):
    """Largest element-wise difference of the arrays `a` from the serial `b`, relative to max(1, |serial|);
    inf where their counts or shapes differ or either holds a NaN."""
    a, b = [np.asarray(p, np.float64) for p in a], [np.asarray(q, np.float64) for q in b]
    if len(a) != len(b) or any(p.shape != q.shape for p, q in zip(a, b)):
        return float("inf")
    if any(np.isnan(p).any() or np.isnan(q).any() for p, q in zip(a, b)):
        return float("inf")
    return max((float(np.max(np.abs(p - q) / np.maximum(1.0, np.abs(q)))) for p, q in zip(a, b) if p.size),
               default=0.0)


def identical_on_ranks(arrays) -> bool:
    """Collective: every rank holds the same bits in `arrays`."""
    gathered = collectives.allgather_object([np.asarray(v).tobytes() for v in arrays])
    return all(part == gathered[0] for part in gathered)
