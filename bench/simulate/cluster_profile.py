"""Cluster profiles: the machine a sweep is predicted on, read from a TOML file.

    name = "HPC-DA"
    devices_per_node = 6          # ranks per node (GPUs, or sockets of a CPU node)
    max_nodes = 32                # counts beyond max_nodes * devices_per_node are refused
    [compute]
    mode = "independent"          # each device computes alone; "shared_node": the ranks
                                  # of a node split its cores (one CPU machine)
    relative_speed = 20.0         # device speed / the measured 1-device run's speed
    cores_per_node = 2            # shared_node only: ranks beyond it time-share cores
    [compute.models.resnet50]     # optional, wins over relative_speed: a step time known
    micro_batch = 64              # for the model on this device (measured or published)
    step_s = 0.168
    [intra_node]                  # between ranks of one node
    latency_us = 5.0
    bandwidth_GBps = 150.0        # per rank
    [inter_node]                  # between nodes
    latency_us = 5.0
    bandwidth_GBps = 25.0         # per node, shared by its ranks' concurrent transfers
    [reduce]
    bandwidth_GBps = 20.0         # speed of the summation kernel, bytes of input per second
    [engine]
    fusion_threshold_kb = 32      # as TNT_FUSION_THRESHOLD_KB
    overlap = true                # buckets are reduced while backprop goes on

GB is 10^9 bytes. `source` says where the numbers come from (measured, or published).
"""
from __future__ import annotations

import dataclasses
import os
import tomllib

from bench.errors import BenchUsageError

__all__ = ["Link", "ModelStep", "ClusterProfile", "load_cluster_profile", "PROFILES_DIR",
           "find_cluster_profile"]

PROFILES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")


@dataclasses.dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float

    def time(self, nbytes: float, sharing: int = 1) -> float:
        return self.latency_s + nbytes * sharing / self.bandwidth_Bps


@dataclasses.dataclass(frozen=True)
class ModelStep:
    micro_batch: int
    step_s: float


@dataclasses.dataclass(frozen=True)
class ClusterProfile:
    name: str
    description: str
    source: str
    devices_per_node: int
    max_nodes: int
    compute_mode: str
    relative_speed: float
    model_steps: dict
    intra: Link
    inter: Link
    reduce_Bps: float
    fusion_threshold_bytes: int
    overlap: bool
    cores_per_node: int = 0
    path: str = ""

    @property
    def max_devices(self) -> int:
        return self.devices_per_node * self.max_nodes


def _link(table: dict, where: str) -> Link:
    try:
        return Link(float(table["latency_us"]) * 1e-6, float(table["bandwidth_GBps"]) * 1e9)
    except KeyError as missing:
        raise BenchUsageError(f"{where} needs latency_us and bandwidth_GBps (missing {missing})") from None


def find_cluster_profile(name_or_path: str) -> str:
    """A path: as given if it exists, else bench/profiles/NAME.toml."""
    if os.path.exists(name_or_path):
        return name_or_path
    shipped = os.path.join(PROFILES_DIR, f"{name_or_path}.toml")
    if os.path.exists(shipped):
        return shipped
    names = sorted(f[:-5] for f in os.listdir(PROFILES_DIR) if f.endswith(".toml"))
    raise BenchUsageError(f"cluster profile {name_or_path!r} not found: give a TOML file or one "
                          f"of the shipped profiles: {', '.join(names)}")


def load_cluster_profile(name_or_path: str) -> ClusterProfile:
    path = find_cluster_profile(name_or_path)
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise BenchUsageError(f"cluster profile {path}: {error}") from None
    compute = data.get("compute", {})
    mode = compute.get("mode", "independent")
    if mode not in ("independent", "shared_node"):
        raise BenchUsageError(f"cluster profile {path}: compute.mode must be independent or "
                              f"shared_node, got {mode!r}")
    engine = data.get("engine", {})
    models = {name: ModelStep(int(v["micro_batch"]), float(v["step_s"]))
              for name, v in compute.get("models", {}).items()}
    return ClusterProfile(
        name=data.get("name", os.path.basename(path)[:-5]),
        description=data.get("description", ""), source=data.get("source", ""),
        devices_per_node=int(data["devices_per_node"]), max_nodes=int(data.get("max_nodes", 1)),
        compute_mode=mode, relative_speed=float(compute.get("relative_speed", 1.0)),
        model_steps=models,
        intra=_link(data.get("intra_node", {}), f"{path} [intra_node]"),
        inter=_link(data.get("inter_node", data.get("intra_node", {})), f"{path} [inter_node]"),
        reduce_Bps=float(data.get("reduce", {}).get("bandwidth_GBps", 10.0)) * 1e9,
        fusion_threshold_bytes=int(engine.get("fusion_threshold_kb", 32)) * 1024,
        overlap=bool(engine.get("overlap", True)),
        cores_per_node=int(compute.get("cores_per_node", data["devices_per_node"])), path=path)
