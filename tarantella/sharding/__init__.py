"""Sharded training state (ZeRO) for data-parallel models: tnt.Model(model, shard="optimizer")."""
from tarantella.sharding.update import MODES, ShardedUpdate, resolve_mode

__all__ = ["MODES", "ShardedUpdate", "resolve_mode"]
