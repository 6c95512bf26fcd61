"""`tnt-bench validate --published horovod`: predict published scaling of another system.

The points (bench/validation/horovod_benchmarks.toml) are efficiencies Horovod published
for its benchmark; the cluster profile (bench/profiles/horovod_pascal_roce.toml) states
that system's hardware and software from its documentation and the GPU's published
1-device throughput, and the models' gradient timelines come from the architectures
(applications.py). None of it saw the efficiencies, so every point is out of sample.
Efficiency of weak scaling: step on 1 device / step on N devices.
"""
from __future__ import annotations

import os
import tomllib

from bench.errors import BenchUsageError
from bench.simulate.cluster_profile import load_cluster_profile
from bench.simulate.step_model import predict_step
from bench.validation.applications import load_application_profile
from bench.validation.record import write_validation

__all__ = ["PUBLISHED", "load_published", "predict_published", "validate_published"]

_HERE = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = {"horovod": os.path.join(_HERE, "horovod_benchmarks.toml")}


def load_published(name: str) -> dict:
    if name not in PUBLISHED:
        raise BenchUsageError(f"--published {name!r}: expected one of {', '.join(PUBLISHED)}")
    with open(PUBLISHED[name], "rb") as handle:
        return tomllib.load(handle)


def predict_published(published: dict, cluster=None) -> list[dict]:
    cluster = cluster or load_cluster_profile(published["cluster"])
    micro = int(published["micro_batch"])
    points = []
    for point in published["point"]:
        profile = load_application_profile(point["model"])
        # the published runs (Horovod) normalise with each rank's own statistics
        one = predict_step(profile, cluster, micro, 1, global_batch_norm=False)
        many = predict_step(profile, cluster, micro, int(point["devices"]), global_batch_norm=False)
        efficiency = one.step_s / many.step_s
        points.append({"model": point["model"], "devices": point["devices"],
                       "published_efficiency": point["efficiency"], "predicted_efficiency": efficiency,
                       "error_points": 100.0 * (efficiency - point["efficiency"]),
                       "relative_error": efficiency / point["efficiency"] - 1.0,
                       "predicted_step_s": many.step_s, "predicted_compute_s": many.compute_s,
                       "predicted_communication_s": many.communication_s,
                       "predicted_exposed_communication_s": many.exposed_communication_s,
                       "predicted_straggler_factor": many.straggler_factor,
                       "predicted_algorithm": many.algorithm, "source": point["source"]})
    return points


def validate_published(name: str, out: str, command: str) -> list[dict]:
    published = load_published(name)
    cluster = load_cluster_profile(published["cluster"])
    points = predict_published(published, cluster)
    write_validation(out, points, cluster, command,
                     {"published": name, "published_file": os.path.relpath(PUBLISHED[name]),
                      "models": {p["model"]: load_application_profile(p["model"])["source"] for p in points}})
    return points
