"""Sharded training state (ZeRO) for data-parallel models:
tnt.Model(model, shard="optimizer" | "gradients" | "weights").

The names below come from update.py, which imports TensorFlow; they are resolved on first access, so that the
simulator can use owners.py (the owners' rule) without it."""

__all__ = ["MODES", "ShardedUpdate", "reduction_to_owners", "resolve_mode", "shard_model_optimizer", "shard_optimizer",
           "sharding_of"]


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'tarantella.sharding' has no attribute {name!r}")
    from tarantella.sharding import update
    return getattr(update, name)
