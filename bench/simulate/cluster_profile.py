"""Cluster profiles: the machine a sweep is predicted on, read from a TOML file.

A profile states hardware and software facts, each with its source in a comment beside
it; nothing in it is fitted to a scaling curve it is later compared with.

    name = "HPC-DA"
    devices_per_node = 6          # ranks per node (GPUs, or processes of a CPU node)
    max_nodes = 32                # counts beyond max_nodes * devices_per_node are refused
    [compute]
    kind = "gpu"                  # "gpu": a device computes alone; "cpu": a device is a
                                  # process with its share of the node's cores
    relative_speed = 150.0        # gpu, models without a figure below: device speed / the
                                  # measured 1-device run's speed
    cores_per_node = 48           # cpu: cores of a node, split among its ranks
    cores_per_rank = 24           # cpu, optional: a rank never uses more (pinned to a socket)
    core_speed = 1.0              # cpu: one core here / one core of the measuring machine
    one_machine = false           # cpu: the "nodes" are namespaces of one machine, so all
                                  # ranks share its cores_per_node cores and its memory
    [compute.models.resnet50]     # optional, wins over the measured profile: a published
    micro_batch = 128             # single-device throughput (gpu: one device; cpu: one
    examples_per_s = 432.0        # process on `cores` cores)
    cores = 24                    # cpu only
    [memory]
    node_bandwidth_GBps = 256.0   # the node's memory bandwidth, shared by its ranks
    core_bandwidth_GBps = 12.0    # optional: what one core can draw alone
    [host_link]                   # gpu: device <-> host copies (the engine reduces in host
    latency_us = 10.0             # memory); cpu ranks copy at their memory share instead
    bandwidth_GBps = 12.0
    [intra_node]                  # between ranks of one node
    latency_us = 1.0
    bandwidth_GBps = 150.0        # per rank
    [inter_node]                  # between nodes
    latency_us = 1.5
    bandwidth_GBps = 12.5         # per node (its network interface), shared by its ranks
    [reduce]
    bandwidth_GBps = 20.0         # the summation kernel, bytes of input per second
    [stragglers]
    cv = 0.02                     # optional: per-rank step-time spread (std / mean); default:
                                  # the spread of the 1-device run measured on this machine
    [input]
    per_example_core_ms = 0.0     # real-data input pipeline, core-milliseconds per example
    cores_per_node = 0            # gpu: host cores feeding the node's devices
    [engine]
    fusion_threshold_kb = 32      # as TNT_FUSION_THRESHOLD_KB
    overlap = true                # buckets are reduced while backprop goes on
    host_copies = true            # gradients go device -> host -> device (tarantella's engine)
    algorithm = "auto"            # or ring | recursive_doubling | rabenseifner | hierarchical

GB is 10^9 bytes. Names: a file path, or a shipped profile by file name or by its `name`,
in any case and with - or _ (hpc-da, HPC-DA and hpc_da are one profile).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tomllib

from bench.errors import BenchUsageError

__all__ = ["Link", "PublishedThroughput", "ClusterProfile", "load_cluster_profile", "PROFILES_DIR",
           "find_cluster_profile", "shipped_profile_names", "same_profile_name"]

PROFILES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
_ALGORITHMS = ("auto", "ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical")


@dataclasses.dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float

    def time(self, nbytes: float, sharing: int = 1) -> float:
        return self.latency_s + nbytes * sharing / self.bandwidth_Bps


@dataclasses.dataclass(frozen=True)
class PublishedThroughput:
    micro_batch: int
    examples_per_s: float
    cores: float = 0.0        # cpu: the cores the published process used


@dataclasses.dataclass(frozen=True)
class ClusterProfile:
    name: str
    description: str
    source: str
    devices_per_node: int
    max_nodes: int
    kind: str                          # gpu | cpu
    relative_speed: float
    model_steps: dict                  # model name -> PublishedThroughput
    intra: Link
    inter: Link
    reduce_Bps: float
    fusion_threshold_bytes: int
    overlap: bool
    cores_per_node: float = 0.0
    cores_per_rank: float = 0.0        # 0: no cap
    core_speed: float = 1.0
    one_machine: bool = False
    node_memory_Bps: float = 0.0       # 0: unknown, memory not modelled
    core_memory_Bps: float = 0.0
    host_link: Link | None = None
    host_copies: bool = True
    algorithm: str = "auto"
    straggler_cv: float | None = None
    input_core_s_per_example: float = 0.0
    input_cores_per_node: float = 0.0
    precision_speed: dict = dataclasses.field(default_factory=dict)  # [compute.precision]: speed vs float32
    path: str = ""
    text: str = ""                     # the file's contents, recorded with every prediction

    def speed_at(self, precision: str) -> float:
        """The device's step speed at a Keras dtype policy relative to float32 (Note [Precision of a simulated
        device] in bench/simulate/compute_model.py); a profile that states none for it is an error."""
        if precision == "float32":
            return 1.0
        if precision not in self.precision_speed:
            raise BenchUsageError(f"cluster profile {self.path or self.name} states no {precision} throughput: add "
                                  f"`{precision} = <speed relative to float32>` under [compute.precision], with "
                                  f"its source, or simulate --precision float32")
        return self.precision_speed[precision]

    @property
    def max_devices(self) -> int:
        return self.devices_per_node * self.max_nodes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def ranks_on_node(self, devices: int) -> int:
        return min(devices, self.devices_per_node)

    def ranks_sharing(self, devices: int) -> int:
        """The ranks that share a node's cores and memory: its own, or all on one machine."""
        return devices if self.one_machine else self.ranks_on_node(devices)

    def rank_cores(self, ranks_on_node: int) -> float:
        """cpu: the cores one rank computes on when `ranks_on_node` share the node."""
        share = self.cores_per_node / ranks_on_node
        return min(share, self.cores_per_rank) if self.cores_per_rank else share

    def rank_memory_Bps(self, ranks_on_node: int) -> float:
        """A rank's share of the node's memory bandwidth (inf when the profile states none)."""
        if not self.node_memory_Bps:
            return float("inf")
        share = self.node_memory_Bps / ranks_on_node
        return min(share, self.core_memory_Bps) if self.core_memory_Bps else share

    def describe(self) -> dict:
        """What a result records about the profile: enough to re-predict it, and its hash."""
        return {"name": self.name, "description": self.description, "source": self.source,
                "profile": self.path, "sha256": self.sha256, "contents": self.text}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def same_profile_name(a: str, b: str) -> bool:
    """Whether two spellings name the same profile ("SuperMUC-NG", "supermuc_ng")."""
    return _normalise(a) == _normalise(b)


def shipped_profile_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(PROFILES_DIR) if f.endswith(".toml"))


def find_cluster_profile(name_or_path: str) -> str:
    """A path: as given if it exists, else the shipped profile of that file name or `name`."""
    if os.path.exists(name_or_path):
        return name_or_path
    for stem in shipped_profile_names():
        path = os.path.join(PROFILES_DIR, f"{stem}.toml")
        if same_profile_name(stem, name_or_path):
            return path
        with open(path, "rb") as handle:
            if same_profile_name(str(tomllib.load(handle).get("name", "")), name_or_path):
                return path
    raise BenchUsageError(f"cluster profile {name_or_path!r} not found: give a TOML file or one "
                          f"of the shipped profiles: {', '.join(shipped_profile_names())}")


def _link(table: dict, where: str) -> Link:
    try:
        return Link(float(table["latency_us"]) * 1e-6, float(table["bandwidth_GBps"]) * 1e9)
    except KeyError as missing:
        raise BenchUsageError(f"{where} needs latency_us and bandwidth_GBps (missing {missing})") from None


def _choice(value: str, allowed, where: str) -> str:
    if value not in allowed:
        raise BenchUsageError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def load_cluster_profile(name_or_path: str) -> ClusterProfile:
    path = find_cluster_profile(name_or_path)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise BenchUsageError(f"cluster profile {path}: {error}") from None
    compute = data.get("compute", {})
    kind = _choice(compute.get("kind", "gpu"), ("gpu", "cpu"), f"cluster profile {path}: compute.kind")
    engine = data.get("engine", {})
    memory = data.get("memory", {})
    inputs = data.get("input", {})
    try:
        models = {name: PublishedThroughput(int(v["micro_batch"]), float(v["examples_per_s"]),
                                            float(v.get("cores", 0.0)))
                  for name, v in compute.get("models", {}).items()}
    except KeyError as missing:
        raise BenchUsageError(f"cluster profile {path}: every [compute.models.X] needs micro_batch and "
                              f"examples_per_s (missing {missing})") from None
    devices_per_node = int(data["devices_per_node"])
    cores_per_node = float(compute.get("cores_per_node", devices_per_node))
    if kind == "cpu" and not models and "core_speed" not in compute:
        raise BenchUsageError(f"cluster profile {path}: a cpu cluster needs compute.core_speed or a "
                              f"published [compute.models.X] throughput")
    stragglers = data.get("stragglers", {})
    return ClusterProfile(
        name=data.get("name", os.path.basename(path)[:-5]),
        description=data.get("description", ""), source=data.get("source", ""),
        devices_per_node=devices_per_node, max_nodes=int(data.get("max_nodes", 1)),
        kind=kind, relative_speed=float(compute.get("relative_speed", 1.0)), model_steps=models,
        intra=_link(data.get("intra_node", {}), f"{path} [intra_node]"),
        inter=_link(data.get("inter_node", data.get("intra_node", {})), f"{path} [inter_node]"),
        reduce_Bps=float(data.get("reduce", {}).get("bandwidth_GBps", 10.0)) * 1e9,
        fusion_threshold_bytes=int(engine.get("fusion_threshold_kb", 32)) * 1024,
        overlap=bool(engine.get("overlap", True)),
        cores_per_node=cores_per_node, cores_per_rank=float(compute.get("cores_per_rank", 0.0)),
        core_speed=float(compute.get("core_speed", 1.0)), one_machine=bool(compute.get("one_machine", False)),
        node_memory_Bps=float(memory.get("node_bandwidth_GBps", 0.0)) * 1e9,
        core_memory_Bps=float(memory.get("core_bandwidth_GBps", 0.0)) * 1e9,
        host_link=_link(data["host_link"], f"{path} [host_link]") if "host_link" in data else None,
        host_copies=bool(engine.get("host_copies", True)),
        algorithm=_choice(engine.get("algorithm", "auto"), _ALGORITHMS, f"cluster profile {path}: "
                                                                          f"engine.algorithm"),
        straggler_cv=float(stragglers["cv"]) if "cv" in stragglers else None,
        input_core_s_per_example=float(inputs.get("per_example_core_ms", 0.0)) / 1e3,
        input_cores_per_node=float(inputs.get("cores_per_node", 0.0)),
        precision_speed={str(k): float(v) for k, v in compute.get("precision", {}).items()},
        path=path, text=text)
