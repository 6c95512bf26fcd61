"""Tarantella: data- and pipeline-parallel training of Keras 3 models over MPI.

    import tarantella as tnt
    model = tnt.Model(model)        # distributed, synchronous, same results as serial

Run with the launcher (`tarantella -n 4 -- train.py`) or plain `python` (1 rank).

The floors of the house, top to bottom; a room imports only rooms on its own floor or below, and the rooms
of one floor not each other (import-linter's contracts in pyproject.toml, tests/test_architecture.py):
  faces        keras (tnt.Model, save and load, callbacks: what a user touches), launcher (the command);
               below them pipeline (make_pipelined_model, load_model: pipelining's own entry, which hands
               it sharding's update for shard="optimizer")
  strategies   pipelining, sharding; data parallelism is tnt.Model's own, run by the shared floor's steps and
               reductions (step/tf_steps.py, step/step_reductions.py)
  shared       _repro (exact mode's step, the recorder), step (the pieces of a training step every strategy
               uses: the step's collectives, gradient and metric reductions, serial random draws, global
               BatchNormalization, empty micro-batches, which callbacks run on which rank, what a strategy
               asks of an optimizer), data (input per rank)
  timeline     the trace of a run's steps and collectives, and its analysis
  runtime      runtime, collectives, channels (point to point), stage_state (released variables), tf_ops,
               config, errors, devices, ... over the C++ engine (_engine)
"""
from tarantella.runtime import (init, is_initialized, get_rank, get_size, get_master_rank,
                                is_master_rank, shutdown)
from tarantella.collectives import (Group, allreduce, broadcast, allgather, barrier,
                                    allgather_object, broadcast_object)
from tarantella.errors import MismatchError, CollectiveTimeoutError, EngineError, GroupFailedError

__version__ = "0.1.0"

import sys as _sys

if "tensorflow" not in _sys.modules:  # else tarantella.keras does it through tf.config
    from tarantella import devices as _devices
    _devices.configure_environment()

# The Keras face imports TensorFlow (seconds, and unwanted by the launcher and
# numpy-only users), so its names are resolved on first access.
_LAZY = {
    "Model": ("tarantella.keras.model", "Model"),
    "ParallelStrategy": ("tarantella.keras.parallel_strategy", "ParallelStrategy"),
    "models": ("tarantella.keras.models", None),
    "keras": ("tarantella.keras", None),
    "data": ("tarantella.data", None),
    "pipeline": ("tarantella.pipeline", None),
    "deferred_weights": ("tarantella.deferred_build", "deferred_weights"),
    "set_deterministic": ("tarantella.determinism", "set_deterministic"),
    "reduce_gradients": ("tarantella.keras.custom_loop", "reduce_gradients"),
    "distribute_dataset": ("tarantella.keras.custom_loop", "distribute_dataset"),
    "broadcast_variables": ("tarantella.keras.custom_loop", "broadcast_variables"),
    "shard_optimizer": ("tarantella.sharding.update", "shard_optimizer"),
    "shard_weights": ("tarantella.keras.custom_loop", "shard_weights"),
    "gathered_gradients": ("tarantella.keras.custom_loop", "gathered_gradients"),
    "distribute_datasets_from_function": ("tarantella.data.from_function", "distribute_datasets_from_function"),
    "elastic": ("tarantella.elastic", None),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tarantella' has no attribute {name!r}")
    import importlib
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "init", "is_initialized", "get_rank", "get_size", "get_master_rank", "is_master_rank", "shutdown",
    "Group", "allreduce", "broadcast", "allgather", "barrier", "allgather_object", "broadcast_object",
    "MismatchError", "CollectiveTimeoutError", "EngineError", "GroupFailedError",
    "Model", "ParallelStrategy", "models", "keras", "data", "pipeline", "deferred_weights", "set_deterministic",
    "reduce_gradients", "distribute_dataset", "broadcast_variables", "distribute_datasets_from_function",
    "shard_optimizer", "shard_weights", "gathered_gradients", "elastic", "__version__",
]
