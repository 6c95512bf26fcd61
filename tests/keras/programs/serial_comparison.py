"""Helpers shared by the programs that compare tnt.Model with serial Keras in one process."""
import json

import numpy as np

import tarantella as tnt

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
