"""What one rank computes per step on a cluster: forward, backward and update seconds.

Note [Compute of a simulated rank]
The figure comes, in this order of preference, from
  1. a published single-device throughput of the model in the cluster profile
     ([compute.models.NAME]: examples/s at a micro-batch; gpu: one device, cpu: one
     process on `cores` cores), scaled linearly to the micro-batch asked for;
  2. the measured 1-device profile (profile.json) of the model on this machine:
     step = fixed + per_example x micro_batch, anchored at the measured step.
     gpu: divided by the profile's relative_speed.
     cpu: a device is a process with its share of the node's cores (cores_per_node /
     ranks on the node, at most cores_per_rank). The measured run says how many cores
     it used (profile "threads"): the per-example work is that many core-seconds per
     core, spread over the rank's cores at core_speed; the fixed part (Python, kernel
     launches) runs on one core and is only slowed when a rank has less than a core.
The measured forward/backward/update split is kept in every case. Work is taken to
divide perfectly among a process's cores (TensorFlow's thread pools do not quite).

Note [Precision of a simulated device]
A simulation runs at a Keras dtype policy (tnt-bench --precision float32,
mixed_float16, mixed_bfloat16). A cluster profile states, per policy, its
device's step speed relative to float32 ([compute.precision], each figure with
its source: tensor cores, a CPU's bfloat16 dot products, or none); float32 is 1.
Published throughputs ([compute.models]) are float32 figures: divided by the
stated speed. A measured profile was taken at its own `precision` on the
measuring machine (bench/profiles/this_machine.toml states that machine's
speeds, measured): multiplied by the measuring machine's speed at that precision
it is a float32 figure, scaled as above, then divided by the cluster's speed at
the simulated precision.
"""
from __future__ import annotations

import dataclasses
import functools

from bench.simulate.cluster_profile import ClusterProfile

__all__ = ["RankCompute", "rank_compute"]


@dataclasses.dataclass(frozen=True)
class RankCompute:
    forward_s: float
    backward_s: float
    update_s: float
    input_s: float          # the input pipeline's work for the rank's micro-batch
    source: str             # "published" or "measured profile"

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s


def _published_step(published, cluster: ClusterProfile, micro_batch: int, cores: float) -> float:
    step = micro_batch / published.examples_per_s
    if cluster.kind == "cpu" and published.cores:
        step *= published.cores / cores
    return step


def _measured_step(profile: dict, cluster: ClusterProfile, micro_batch: int, cores: float) -> float:
    fixed = min(profile.get("fixed_s", 0.0), profile["step_s"])
    per_example = (profile["step_s"] - fixed) / profile["micro_batch"]
    if cluster.kind == "gpu":
        return (fixed + per_example * micro_batch) / cluster.relative_speed
    measured_cores = float(profile.get("threads") or cluster.cores_per_node)
    variable = per_example * micro_batch * measured_cores / (cores * cluster.core_speed)
    fixed = fixed / cluster.core_speed * max(1.0, 1.0 / cores)
    return fixed + variable


@functools.lru_cache(maxsize=None)
def _measuring_machine() -> ClusterProfile:  # read once, not per simulated device count
    from bench.simulate.cluster_profile import load_cluster_profile
    return load_cluster_profile("this_machine")


def _input_s(cluster: ClusterProfile, decoded: int, ranks_on_node: int, cores: float) -> float:
    if not cluster.input_core_s_per_example:
        return 0.0
    feeding = cores if cluster.kind == "cpu" else cluster.input_cores_per_node / ranks_on_node
    return cluster.input_core_s_per_example * decoded / max(feeding, 1e-9)


def rank_compute(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int,
                 real_data: bool = False, precision: str = "float32",
                 measuring: ClusterProfile | None = None, shard_after_decode: bool = False) -> RankCompute:
    """One rank's mean compute per step when `devices` ranks run on `cluster` at `precision` (Note [Precision
    of a simulated device]; `measuring`: the profile of the machine the model profile was measured on). With
    real data a rank decodes its micro-batch, or with shard_after_decode the whole global batch (Note [Sharding
    after the decode] in bench/data/jpeg_pipeline.py)."""
    ranks_on_node = cluster.ranks_sharing(devices)
    cores = cluster.rank_cores(ranks_on_node) if cluster.kind == "cpu" else 1.0
    published = cluster.model_steps.get(profile["model"])
    if published is not None:
        step, source = _published_step(published, cluster, micro_batch, cores), "published"
    else:
        step, source = _measured_step(profile, cluster, micro_batch, cores), "measured profile"
        measured_at = profile.get("precision", "float32")
        if measured_at != "float32":
            step *= (measuring or _measuring_machine()).speed_at(measured_at)
    step /= cluster.speed_at(precision)
    measured = profile["forward_s"] + profile["backward_s"] + profile["update_s"]
    scale = step / measured if measured > 0 else 0.0
    decoded = micro_batch * (devices if shard_after_decode else 1)
    input_s = _input_s(cluster, decoded, ranks_on_node, cores) if real_data else 0.0
    return RankCompute(profile["forward_s"] * scale, profile["backward_s"] * scale,
                       profile["update_s"] * scale, input_s, source)
