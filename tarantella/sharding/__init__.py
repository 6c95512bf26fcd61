"""Sharded training state (ZeRO) for data-parallel models: tnt.Model(model, shard="optimizer")."""
from tarantella.sharding.update import MODES, ShardedUpdate, resolve_mode, shard_optimizer, sharding_of

__all__ = ["MODES", "ShardedUpdate", "resolve_mode", "shard_optimizer", "sharding_of"]
