"""Tarantella: data- and pipeline-parallel training of Keras 3 models over MPI.

    import tarantella as tnt
    model = tnt.Model(model)        # distributed, synchronous, same results as serial

Run with the launcher (`tarantella -n 4 -- train.py`) or plain `python` (1 rank).
"""
from tarantella.runtime import (init, is_initialized, get_rank, get_size, get_master_rank,
                                is_master_rank, shutdown)
from tarantella.collectives import (Group, allreduce, broadcast, allgather, barrier,
                                    allgather_object, broadcast_object)
from tarantella.errors import MismatchError, CollectiveTimeoutError, EngineError

__version__ = "0.1.0"

__all__ = [
    "init", "is_initialized", "get_rank", "get_size", "get_master_rank", "is_master_rank", "shutdown",
    "Group", "allreduce", "broadcast", "allgather", "barrier", "allgather_object", "broadcast_object",
    "MismatchError", "CollectiveTimeoutError", "EngineError",
    "__version__",
]
