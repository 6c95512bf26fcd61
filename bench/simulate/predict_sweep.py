"""Simulated sweep rows: the same columns as measured runs, marked simulated."""
from __future__ import annotations

import math

from bench.errors import BenchUsageError
from bench.simulate.cluster_profile import ClusterProfile
from bench.simulate.step_model import predict_step

__all__ = ["check_cluster_capacity", "simulated_row"]


def check_cluster_capacity(counts: list[int], cluster: ClusterProfile) -> None:
    too_many = [c for c in counts if c > cluster.max_devices]
    if too_many:
        raise BenchUsageError(
            f"cluster profile {cluster.name!r} has {cluster.max_devices} devices "
            f"({cluster.max_nodes} nodes x {cluster.devices_per_node}); cannot simulate "
            f"{', '.join(map(str, too_many))}: raise max_nodes in {cluster.path} or lower --devices")


def simulated_row(profile: dict, cluster: ClusterProfile, devices: int, micro_batch: int,
                  exchange_gradients: bool = True, real_data: bool = False, precision: str = "float32",
                  shard_after_decode: bool = False) -> dict:
    """A runs.csv row for `devices` ranks of `cluster` at `precision` (figures derived later)."""
    prediction = predict_step(profile, cluster, micro_batch, devices, exchange_gradients=exchange_gradients,
                              real_data=real_data, precision=precision, shard_after_decode=shard_after_decode)
    nodes = math.ceil(devices / cluster.devices_per_node)
    return {
        "devices": devices, "nodes": nodes, "devices_per_node": min(devices, cluster.devices_per_node),
        "simulated": True, "cluster": cluster.name, "oversubscribed": False,
        "micro_batch": micro_batch, "global_batch": micro_batch * devices, "precision": precision,
        "step_time_median_s": prediction.step_s, "step_time_mean_s": prediction.step_s,
        "step_time_min_s": prediction.step_s, "step_time_max_s": prediction.step_s,
        "step_time_std_s": 0.0, "step_times_s": [prediction.step_s],
        "predicted_compute_s": prediction.compute_s,
        "predicted_communication_s": prediction.communication_s,
        "predicted_exposed_communication_s": prediction.exposed_communication_s,
        "predicted_copy_s": prediction.copy_s,
        "predicted_straggler_factor": prediction.straggler_factor,
        "predicted_input_s": prediction.input_s,
        "predicted_buckets": prediction.buckets,
        "predicted_algorithm": prediction.algorithm,
        "predicted_compute_source": prediction.compute_source,
        "predicted_statistics_s": prediction.statistics_s,
        "predicted_statistics_allreduces": prediction.statistics_allreduces,
        "cluster_sha256": cluster.sha256,
    }
