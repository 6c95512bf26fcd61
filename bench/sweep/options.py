"""The options of one scaling sweep, as the CLI resolved them."""
from __future__ import annotations

import dataclasses

__all__ = ["SweepOptions"]


@dataclasses.dataclass
class SweepOptions:
    model: str
    counts: list[int]
    framework: str = "tnt"
    micro_batch: int | None = None      # weak scaling: global batch = micro_batch x devices
    global_batch: int | None = None     # strong scaling: micro batch = global_batch / devices
    steps: int = 10
    warmup_steps: int = 2
    data: str = "synthetic"
    input_sharding: str = "files"       # --data jpeg: "files" (each rank its own) or "after-decode" (the original's)
    precision: str = "float32"          # the Keras dtype policy the model trains (and is simulated) at
    data_dir: str | None = None
    hostfile: str | None = None
    npernode: int | None = None
    launch_agent: str | None = None     # passed to the launcher (a namespace cluster's agent)
    network_interface: str | None = None
    oversubscribe: bool = False
    simulate: bool = False
    cluster: str | None = None          # profile for --simulate, or to validate measured runs
    model_profile: str | None = None    # a measured profile.json to simulate from
    out: str = "results/sweep"
    timeout_s: float = 1800.0           # per run
    seed: int = 1
    timeline_dir: str | None = None     # each measured run writes <dir>/<model>_<framework>_x<devices>.json
    kill_rank_at: int | None = None     # the largest measured count again, elastic, a rank killed after this step
    plots: bool = True
    progress: bool = True
    command: str = ""

    @property
    def scaling(self) -> str:
        return "strong" if self.global_batch else "weak"

    def micro_batch_for(self, devices: int, default: int) -> int:
        if self.global_batch:
            return self.global_batch // devices
        return self.micro_batch or default
