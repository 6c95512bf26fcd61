"""One training step on N devices: compute, fused buckets, and their overlap with backprop.

Note [Simulated step timeline]
The reducer (csrc/engine/fused_reducer.hpp) lays gradients out in the order
backprop produces them and closes a bucket once it holds at least the fusion
threshold; its progress thread reduces buckets one at a time, in id order. So:
    ready(bucket)  = forward + backward x ready_fraction of the bucket's last gradient
    start(i)       = max(ready(i), end(i-1))       (end(i-1) = 0 for the first bucket)
    end(i)         = start(i) + allreduce_time(bytes(i))
    step           = max(forward + backward, end(last)) + update
Without overlap every bucket waits for the end of backprop. The optimizer update
runs after the last bucket, as tnt.Model applies all gradients at once.
"""
from __future__ import annotations

import dataclasses

from bench.simulate.allreduce_cost import allreduce_time
from bench.simulate.cluster_profile import ClusterProfile

__all__ = ["Bucket", "lay_out_buckets", "compute_times", "StepPrediction", "predict_step"]


@dataclasses.dataclass(frozen=True)
class Bucket:
    nbytes: int
    ready_fraction: float     # of the backward pass, when its last gradient is complete


def lay_out_buckets(gradients: list[dict], threshold_bytes: int) -> list[Bucket]:
    """As FusedReducer::lay_out, for gradients in ready order (one dtype)."""
    buckets, size, ready = [], 0, 0.0
    for gradient in gradients:
        if size and size >= threshold_bytes:
            buckets.append(Bucket(size, ready))
            size = 0
        size += gradient["bytes"]
        ready = max(ready, gradient["ready_fraction"])
    if size:
        buckets.append(Bucket(size, ready))
    return buckets


def compute_times(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int) -> dict:
    """Forward, backward and update seconds of one rank's micro-batch on the cluster."""
    model_step = cluster.model_steps.get(profile["model"])
    if model_step is not None:
        step = model_step.step_s * micro_batch / model_step.micro_batch
    else:
        # Anchored at the measured step: at the profile's micro-batch and 1 device the
        # prediction is the measured step time, whatever the phase timings said.
        fixed_s = min(profile.get("fixed_s", 0.0), profile["step_s"])
        per_example = (profile["step_s"] - fixed_s) / profile["micro_batch"]
        fixed = fixed_s / cluster.relative_speed
        variable = per_example * micro_batch / cluster.relative_speed
        if cluster.compute_mode == "shared_node":
            # The node's cores are split among its ranks: the per-example work runs at the
            # node's throughput, which one rank with all cores measured, so it takes `ranks
            # on the node` times longer per example. The fixed part (Python, kernel launches)
            # is mostly serial; it is slowed only once ranks outnumber the cores.
            ranks = min(devices, cluster.devices_per_node)
            variable *= ranks
            fixed *= max(1.0, ranks / cluster.cores_per_node)
        step = fixed + variable
    measured = profile["forward_s"] + profile["backward_s"] + profile["update_s"]
    scale = step / measured if measured > 0 else 0.0
    return {"forward_s": profile["forward_s"] * scale, "backward_s": profile["backward_s"] * scale,
            "update_s": profile["update_s"] * scale}


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    step_s: float
    compute_s: float
    communication_s: float        # sum of the buckets' allreduce times
    exposed_communication_s: float  # what the step waits for beyond compute
    buckets: int


def predict_step(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int,
                 algorithm: str = "auto", exchange_gradients: bool = True) -> StepPrediction:
    """The step time; exchange_gradients=False for the keras baseline, whose ranks share nothing."""
    times = compute_times(profile, cluster, micro_batch, devices)
    forward, backward, update = times["forward_s"], times["backward_s"], times["update_s"]
    buckets = lay_out_buckets(profile["gradients"], cluster.fusion_threshold_bytes)
    end = 0.0
    communication = 0.0
    for bucket in buckets:
        ready = forward + backward * (bucket.ready_fraction if cluster.overlap else 1.0)
        cost = allreduce_time(bucket.nbytes, devices, cluster, algorithm) if exchange_gradients else 0.0
        communication += cost
        end = max(ready, end) + cost
    compute = forward + backward + update
    backprop_end = forward + backward
    step = max(backprop_end, end) + update
    return StepPrediction(step, compute, communication, step - compute, len(buckets))
