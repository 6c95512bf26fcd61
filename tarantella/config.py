"""The one table of runtime settings.

Every setting is defined once here: its name, the environment variable each rank
reads, the launcher flag that sets that variable, its type, default, unit and
meaning. The launcher builds its flags from this table, the library reads the
environment through it, and the C++ engine receives the resolved values from
the Python face (it never reads the environment itself), so a name or default
cannot drift between Python and C++.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Mapping

from tarantella.memory_budget import parse_size as _parse_memory_budget

__all__ = ["Setting", "SETTINGS", "Config", "load_config", "ConfigError"]


class ConfigError(ValueError):
    """A setting in the environment has a value that cannot be used."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected one of 1/0/true/false/yes/no/on/off, got {text!r}")


def _parse_non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a whole number >= 0, got {text!r}")
    return value


def _parse_positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


def _parse_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {text!r}")
    return level


def _parse_timeline_path(text: str) -> str:
    path = text.strip()
    if path and os.path.isdir(path):
        raise ValueError(f"expected a file name for the trace, got the directory {text!r}")
    return os.path.abspath(path) if path else ""


ALLREDUCE_ALGORITHMS = ("auto", "ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical", "mpi")


SHARD_MODES = ("optimizer", "gradients", "weights")


def _parse_shard(text: str) -> str:
    mode = text.strip().lower()
    if mode in ("", "off", "none"):
        return ""
    if mode not in SHARD_MODES:
        raise ValueError(f"expected one of {', '.join(SHARD_MODES)} or off, got {text!r}")
    return mode


def _parse_algorithm(text: str) -> str:
    name = text.strip().lower()
    if name not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"expected one of {', '.join(ALLREDUCE_ALGORITHMS)}, got {text!r}")
    return name


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str            # attribute of Config
    env: str             # variable each rank reads
    flag: str            # launcher flag that sets `env` (None: environment only)
    default: Any
    parse: Callable[[str], Any]
    unit: str
    help: str
    flag_is_switch: bool = False  # the flag takes no value and sets the variable to 1


SETTINGS: tuple[Setting, ...] = (
    Setting("fusion_threshold_kb", "TNT_FUSION_THRESHOLD_KB", "--fusion-threshold", 32,
            _parse_non_negative_int, "KiB",
            "gradients are fused into buckets of at least this size before they are "
            "allreduced; 0 gives one bucket per tensor"),
    Setting("timeout_seconds", "TNT_TIMEOUT_SECONDS", "--timeout", 300.0,
            _parse_positive_float, "s",
            "a collective that waits longer than this for other ranks raises an error "
            "naming the ranks not heard from"),
    Setting("launch_timeout_seconds", "TNT_LAUNCH_TIMEOUT_SECONDS", "--launch-timeout", 20.0,
            _parse_positive_float, "s",
            "the launcher stops a job (exit code 2, naming the hosts) when not every rank has "
            "started this long after mpirun (unreachable host, failing --launch-agent)"),
    Setting("stall_warning_seconds", "TNT_STALL_WARNING_SECONDS", "--stall-warning", 60.0,
            _parse_positive_float, "s",
            "a collective that waits longer than this logs a warning naming the missing ranks"),
    Setting("allreduce_algorithm", "TNT_ALLREDUCE_ALGORITHM", "--allreduce-algorithm", "auto",
            _parse_algorithm, "",
            "allreduce algorithm used by the gradient reducer and by tnt.allreduce: "
            + ", ".join(ALLREDUCE_ALGORITHMS)),
    Setting("log_level", "TNT_LOG_LEVEL", "--log-level", "WARNING",
            _parse_log_level, "", "log level of the tarantella logger"),
    Setting("log_on_all_devices", "TNT_LOG_ON_ALL_DEVICES", "--log-on-all-devices", False,
            _parse_bool, "", "log from every rank, not just the master rank", True),
    Setting("output_on_all_devices", "TNT_OUTPUT_ON_ALL_DEVICES", "--output-on-all-devices", False,
            _parse_bool, "",
            "show every rank's output (prefixed with the rank) and run output callbacks "
            "(progress bar, checkpoints, loggers) on every rank", True),
    Setting("no_gpu", "TNT_NO_GPU", "--no-gpu", False, _parse_bool, "",
            "hide all GPUs from the ranks and run on the CPU", True),
    Setting("memory_budget_bytes", "TNT_MEMORY_BUDGET", "--memory-budget", 0, _parse_memory_budget, "",
            "each rank's peak resident memory may not exceed this size (e.g. 1.5GiB, 800MiB; powers of "
            "1024); a rank over it ends the job naming rank, host, peak and budget; 0 or empty: no budget "
            "(Note [The per-rank memory budget] in tarantella/memory_budget.py)"),
    Setting("shard", "TNT_SHARD", "--shard", "", _parse_shard, "",
            "shard the training state of data-parallel models over the ranks (ZeRO): optimizer (stage 1: "
            "each rank keeps the optimizer state of its own variables), gradients (stage 2: and receives only their "
            "summed gradients), weights (stage 3: and only its own weights, gathered layer by layer for each "
            "pass); empty or off: every rank keeps all of it "
            "(tnt.Model's shard= argument overrides it; Note [A sharded update] in tarantella/sharding/update.py)"),
    Setting("shard_spread_kb", "TNT_SHARD_SPREAD_KB", "--shard-spread", 256, _parse_non_negative_int, "KiB",
            "with --shard from 3 ranks: a variable of at least this size is handed over, gathered and summed on "
            "its owner in parts relayed by every other rank, so no rank's link carries more than about its bytes "
            "whatever the rank count; smaller ones go whole, directly (Note [Spread transfers] in "
            "tarantella/sharding/spread_transfers.py)"),
    Setting("timeline", "TNT_TIMELINE", "--timeline", "", _parse_timeline_path, "",
            "write a Chrome/Perfetto trace of the training (steps, backward pass, per-bucket allreduce, "
            "optimizer update, metric reduction, pipeline passes) to this file, merged from every rank at "
            "exit; empty: off (see Note [Timeline span names] in tarantella/timeline/names.py)"),
)

_BY_ENV = {setting.env: setting for setting in SETTINGS}


@dataclasses.dataclass(frozen=True)
class Config:
    fusion_threshold_kb: int
    timeout_seconds: float
    launch_timeout_seconds: float
    stall_warning_seconds: float
    allreduce_algorithm: str
    log_level: str
    log_on_all_devices: bool
    output_on_all_devices: bool
    no_gpu: bool
    memory_budget_bytes: int = 0
    timeline: str = ""
    shard: str = ""
    shard_spread_kb: int = 256

    @property
    def fusion_threshold_bytes(self) -> int:
        return self.fusion_threshold_kb * 1024

    @property
    def shard_spread_bytes(self) -> int:
        return self.shard_spread_kb * 1024


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    """Resolve every setting from the environment, falling back to its default."""
    environ = os.environ if environ is None else environ
    values = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env)
        if raw is None:
            values[setting.name] = setting.default
            continue
        try:
            values[setting.name] = setting.parse(raw)
        except ValueError as error:
            raise ConfigError(
                f"{setting.env}={raw!r} is invalid: {error}; "
                f"set it as the launcher flag {setting.flag} describes ({setting.help})") from None
    return Config(**values)


def describe(config: Config) -> str:
    """One line with the effective configuration, logged at start."""
    return " ".join(f"{s.name}={getattr(config, s.name)}" for s in SETTINGS)


def setting_for_env(env: str) -> Setting | None:
    return _BY_ENV.get(env)


logger = logging.getLogger("tarantella")
