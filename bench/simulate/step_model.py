"""One training step on N devices: compute, stragglers, input, copies, fused buckets, overlap.

Note [Simulated step timeline]
Every term is a cost the cluster profile states from hardware and software facts
(bench/simulate/cluster_profile.py) or the 1-device profile measured on this machine;
nothing is fitted to a scaling curve.
    compute      one rank's forward/backward/update (Note [Compute of a simulated rank]),
                 times the straggler factor: the step waits for the slowest of N ranks
                 (bench/simulate/stragglers.py)
    input        the input pipeline's per-example cost: on a gpu node it runs on the host
                 cores beside the device (prefetch hides it unless it is the longer), on a
                 cpu node it takes the rank's own cores (added: measured so on 2 cores,
                 results/input_cost/README.md); a rank decodes its micro-batch, or the whole
                 global batch where the ranks shard after the decode (the original's runs)
    buckets      the reducer (csrc/engine/fused_reducer.hpp) lays gradients out in the
                 order backprop produces them and closes a bucket once it holds at least
                 the fusion threshold; its progress thread reduces buckets one at a time
    copies       the engine reduces in host memory: with host_copies, every bucket goes
                 device -> host when its last gradient is ready and host -> device after
                 its allreduce, over the host link (cpu: a copy at the rank's share of the
                 node's memory bandwidth); copies run one at a time per direction
    allreduce    per bucket, the algorithm the engine would choose (allreduce_cost.py)
    statistics   BatchNormalization over the global batch: per layer and step the blocking
                 allreduces of tarantella/batch_norm_allreduces.py (forward: one of
                 N x (2C + 1) values, or two of C + 1 and C; backward: one of 2C), each a
                 point where compute stops until the sum is back: added to the forward and
                 the backward pass (not with batch_norm="local", nor on 1 device)
So, with ready(i) = forward + backward x ready_fraction(i) (x 1 without overlap):
    out(i)   = max(ready(i), out(i-1)) + copy(i)         (= ready(i) without copies)
    end(i)   = max(out(i), end(i-1)) + allreduce(i)
    back(i)  = max(end(i), back(i-1)) + copy(i)          (= end(i) without copies)
    step     = max(forward + backward, back(last)) + update
Exposed communication is what the step waits for after backprop: step - compute.
On 1 device nothing is exchanged or copied (the engine returns at once).
"""
from __future__ import annotations

import dataclasses

from bench.simulate.allreduce_cost import allreduce_time, choose_algorithm
from bench.simulate.cluster_profile import ClusterProfile
from bench.simulate.compute_model import rank_compute
from bench.simulate.stragglers import measured_cv, straggler_factor
from tarantella.batch_norm_allreduces import allreduce_values

__all__ = ["Bucket", "lay_out_buckets", "StepPrediction", "predict_step", "straggler_cv", "RankPhases",
           "rank_phases", "host_copy_time"]


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


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    step_s: float
    compute_s: float                # the slowest rank's forward + backward + update (+ input)
    communication_s: float          # sum of the buckets' allreduce times
    copy_s: float                   # sum of device <-> host copies
    exposed_communication_s: float  # what the step waits for beyond compute
    straggler_factor: float
    input_s: float
    buckets: int
    algorithm: str                  # the engine's choice for the largest bucket
    compute_source: str
    statistics_s: float = 0.0       # BatchNormalization's blocking statistics allreduces, forward and backward
    statistics_allreduces: int = 0  # their number per step


def straggler_cv(profile: dict, cluster: ClusterProfile) -> float:
    """The profile's stated spread, else the measured 1-device run's (0 if it has none)."""
    if cluster.straggler_cv is not None:
        return cluster.straggler_cv
    return measured_cv(profile.get("step_times_s", []))


def host_copy_time(nbytes: int, cluster: ClusterProfile, devices: int) -> float:
    if cluster.kind == "gpu" and cluster.host_link is not None:
        return cluster.host_link.time(nbytes)
    bandwidth = cluster.rank_memory_Bps(cluster.ranks_sharing(devices))
    return nbytes / bandwidth if bandwidth != float("inf") else 0.0


def statistics_cost(profile: dict, cluster: ClusterProfile, devices: int, algorithm: str) -> tuple[float, float, int]:
    """(forward seconds, backward seconds, allreduces) of the global BatchNormalization statistics per step."""
    forward = backward = 0.0
    count = 0
    for layer in profile.get("batch_norm", []):
        forward_values, backward_values = allreduce_values(layer["channels"], devices)
        forward += sum(allreduce_time(4 * values, devices, cluster, algorithm) for values in forward_values)
        backward += sum(allreduce_time(4 * values, devices, cluster, algorithm) for values in backward_values)
        count += len(forward_values) + len(backward_values)
    return forward, backward, count


@dataclasses.dataclass(frozen=True)
class RankPhases:
    """One rank's forward, backward and update, the straggler factor applied, with the input pipeline's cost
    and the blocking BatchNormalization statistics allreduces inside forward and backward."""
    forward_s: float
    backward_s: float
    update_s: float
    statistics_forward_s: float
    statistics_backward_s: float
    statistics_allreduces: int
    straggler_factor: float
    rank: object                    # compute_model.RankCompute


def rank_phases(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int, algorithm: str,
                real_data: bool, global_statistics: bool, precision: str,
                shard_after_decode: bool = False) -> RankPhases:
    rank = rank_compute(profile, cluster, micro_batch, devices, real_data, precision,
                        shard_after_decode=shard_after_decode)
    factor = straggler_factor(straggler_cv(profile, cluster), devices)
    forward, backward, update = rank.forward_s * factor, rank.backward_s * factor, rank.update_s * factor
    if cluster.kind == "cpu":
        forward += rank.input_s
    else:
        forward += max(0.0, rank.input_s - (forward + backward + update))
    statistics_forward = statistics_backward = 0.0
    statistics = 0
    if global_statistics and devices > 1:
        statistics_forward, statistics_backward, statistics = statistics_cost(profile, cluster, devices, algorithm)
    return RankPhases(forward + statistics_forward, backward + statistics_backward, update, statistics_forward,
                      statistics_backward, statistics, factor, rank)


def predict_step(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int,
                 algorithm: str | None = None, exchange_gradients: bool = True,
                 real_data: bool = False, global_batch_norm: bool = True,
                 precision: str = "float32", shard_after_decode: bool = False) -> StepPrediction:
    """The step time; exchange_gradients=False for the keras baseline, whose ranks share nothing;
    global_batch_norm=False for batch_norm="local"; shard_after_decode: every rank decodes the global batch
    (Note [Sharding after the decode] in bench/data/jpeg_pipeline.py)."""
    algorithm = algorithm or cluster.algorithm
    exchanging = exchange_gradients and devices > 1
    phases = rank_phases(profile, cluster, micro_batch, devices, algorithm, real_data,
                         exchanging and global_batch_norm, precision, shard_after_decode)
    forward, backward, update = phases.forward_s, phases.backward_s, phases.update_s
    statistics_forward, statistics_backward = phases.statistics_forward_s, phases.statistics_backward_s
    rank, factor, statistics = phases.rank, phases.straggler_factor, phases.statistics_allreduces
    buckets = lay_out_buckets(profile["gradients"], cluster.fusion_threshold_bytes)
    copies = exchanging and cluster.host_copies
    out = end = back = 0.0
    communication = copied = 0.0
    for bucket in buckets if exchanging else []:
        ready = forward + backward * (bucket.ready_fraction if cluster.overlap else 1.0)
        copy = host_copy_time(bucket.nbytes, cluster, devices) if copies else 0.0
        out = max(ready, out) + copy
        cost = allreduce_time(bucket.nbytes, devices, cluster, algorithm)
        end = max(out, end) + cost
        back = max(end, back) + copy
        communication += cost
        copied += 2 * copy
    compute = forward + backward + update - statistics_forward - statistics_backward  # statistics: communication
    step = max(forward + backward, back) + update
    largest = max((b.nbytes for b in buckets), default=0)
    chosen = (choose_algorithm(largest, devices, cluster) if algorithm == "auto" else algorithm) \
        if exchanging else "none"
    return StepPrediction(step, compute, communication, copied, step - compute, factor, rank.input_s,
                          len(buckets), chosen, rank.source, statistics_forward + statistics_backward, statistics)
