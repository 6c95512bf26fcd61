"""Timeline marks inside a compiled step (Note [Timeline marks] in csrc/tf/timeline_ops.cc).

While the timeline is off every function here returns its input unchanged and
adds no op: the step's graph is the same as without the timeline.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from tarantella.timeline import session

__all__ = ["mark", "mark_each", "mark_after_updates", "drain", "LOSS", "GRADIENT", "REDUCED", "UPDATED",
           "OWN_UPDATES", "HANDED_OVER", "TO_OWNER",
           "STATISTICS_SENT", "STATISTICS_SUMMED"]

LOSS = "loss"            # the scaled loss exists: backprop begins
GRADIENT = "gradient"    # a gradient was produced
REDUCED = "reduced"      # a reduced gradient was delivered to the optimizer
UPDATED = "updated"      # a variable's optimizer update was written
STATISTICS_SENT = "statistics_sent"      # a blocking statistics allreduce's input exists
STATISTICS_SUMMED = "statistics_summed"  # its sum exists
OWN_UPDATES = "own_updates"   # shard="optimizer": this rank's own updates are written
HANDED_OVER = "handed_over"   # shard="optimizer": an updated weight left for, or arrived from, its owner
TO_OWNER = "to_owner"         # shard="gradients": a gradient left for its owner, or arrived at this owner
GATHERED = "gathered"         # shard="weights": a layer's weight left its owner, or arrived for a pass
_EVENTS = (LOSS, GRADIENT, REDUCED, UPDATED, STATISTICS_SENT, STATISTICS_SUMMED, OWN_UPDATES, HANDED_OVER, TO_OWNER,
           GATHERED)


@functools.lru_cache(maxsize=None)
def _ops():
    import tensorflow as tf
    from tarantella import tf_ops
    ops = tf_ops.load_ops()

    @tf.RegisterGradient("TntTimelineMark")
    def _identity_gradient(_, gradient):  # a mark inside a GradientTape is an identity
        return gradient

    return ops


def mark(tensor, event: str):
    """`tensor`, noting when it exists (call while tracing)."""
    if not session.enabled():
        return tensor
    return _ops().tnt_timeline_mark(tensor, event=_EVENTS.index(event))


def mark_each(tensors: list, event: str) -> list:
    if not session.enabled():
        return tensors
    return [tensor if tensor is None else mark(tensor, event) for tensor in tensors]


def mark_after_updates(variables, event: str = UPDATED) -> None:
    """Note when each variable's last write created so far (the optimizer's update) has run."""
    if not session.enabled():
        return
    ops = _ops()
    for variable in variables:
        handle = getattr(variable, "handle", None)
        if handle is None:  # a Keras 3 Variable wraps the TF one
            handle = getattr(getattr(variable, "value", None), "handle", None)
        if handle is not None:
            ops.tnt_timeline_mark_after(handle, event=_EVENTS.index(event))


@functools.lru_cache(maxsize=None)
def _drain_function():
    from tarantella import tf_ops
    _ops()  # loaded into TensorFlow first: ctypes then gets the same copy (same marks buffer)
    function = ctypes.CDLL(tf_ops.library_path()).tnt_timeline_drain
    function.restype = ctypes.c_size_t
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


def drain() -> list[tuple[str, float]]:
    """The marks noted since the last drain, oldest first: (event, CLOCK_MONOTONIC seconds)."""
    drained = []
    capacity = 4096
    events = np.empty(capacity, np.int64)
    seconds = np.empty(capacity, np.float64)
    while True:
        count = _drain_function()(events.ctypes.data, seconds.ctypes.data, capacity)
        drained.extend((_EVENTS[int(e)], float(s)) for e, s in zip(events[:count], seconds[:count]))
        if count < capacity:
            return drained
