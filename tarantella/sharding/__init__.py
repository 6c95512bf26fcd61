"""Sharded training state (ZeRO) for data-parallel models:
tnt.Model(model, shard="optimizer" | "gradients" | "weights")."""
from tarantella.sharding.update import (MODES, ShardedUpdate, reduction_to_owners, resolve_mode, shard_model_optimizer,
                                        shard_optimizer, sharding_of)

__all__ = ["MODES", "ShardedUpdate", "reduction_to_owners", "resolve_mode", "shard_model_optimizer", "shard_optimizer",
           "sharding_of"]
