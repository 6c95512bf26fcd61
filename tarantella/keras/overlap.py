"""How much of a step's gradient communication overlapped backprop, from the
reducer's per-bucket times (FusedReducer::last_step_times).

A bucket is queued when its last gradient is ready; the last bucket queued
marks the end of backprop. Communication before that moment is hidden behind
computation; what runs after it is exposed (the step waits for it).
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["communication_profile"]


def communication_profile(bucket_times: Sequence[tuple[float, float, float]]) -> dict:
    """bucket_times: (queued, started, finished) per bucket, seconds on one clock.

    Returns seconds of allreduce in total, hidden (before backprop ended) and
    exposed (from the end of backprop to the last bucket's end), and the hidden fraction."""
    if not bucket_times:
        return {"buckets": 0, "communication_s": 0.0, "hidden_s": 0.0, "exposed_s": 0.0, "hidden_fraction": 0.0}
    backprop_end = max(queued for queued, _, _ in bucket_times)
    communication = sum(finished - started for _, started, finished in bucket_times)
    hidden = sum(max(0.0, min(finished, backprop_end) - started) for _, started, finished in bucket_times)
    exposed = max(0.0, max(finished for _, _, finished in bucket_times) - backprop_end)
    return {"buckets": len(bucket_times), "communication_s": communication, "hidden_s": hidden,
            "exposed_s": exposed, "hidden_fraction": hidden / communication if communication > 0 else 0.0}
