"""Micro-batches of global batches that one rank read, given to their ranks in one all-to-all exchange.

    exchange(pieces) -> received

`pieces[s]` is what this rank sends to rank s (a structure of numpy arrays, or
None); `received[j]` is what rank j sent to this one. Every rank of the job
calls it at the same point of its input stream (Note [Reading a PyDataset per
rank] in python_input.py). It runs on the engine's alltoallv
(csrc/engine/alltoall.hpp) over a group of its own, split once from the world:
the input pipeline's thread exchanges while the training thread's collectives
(order check, metric reduction) run on the world group and the gradient
reducer on its own duplicate (Note [One communicator per user] in
csrc/engine/process_group.hpp). A rank receives only its micro-batches: about
1/N of each global batch, where an allgather of whole batches would bring all
of it.
"""
from __future__ import annotations

import pickle
import threading

from tarantella import collectives

__all__ = ["prepare", "exchange"]

_GROUP: collectives.Group | None = None
_LOCK = threading.Lock()


def prepare() -> None:
    """Collective, on every rank at the same point (the first time only): the exchange's own group."""
    global _GROUP
    with _LOCK:
        if _GROUP is None:
            _GROUP = collectives.Group.world().split(0)


def exchange(pieces: list) -> list:
    """Collective: `pieces[s]` (picklable: numpy arrays, structures of them, None) goes to rank s; returns what
    every rank sent to this one, in rank order. `prepare()` must have run on every rank."""
    from tarantella import _engine
    if _GROUP is None:
        raise AssertionError("tarantella: batch_exchange.prepare() was not called before exchange()")
    blocks = [pickle.dumps(piece, protocol=pickle.HIGHEST_PROTOCOL) for piece in pieces]
    return [pickle.loads(block) for block in _engine.alltoall_bytes(blocks, collectives._handle(_GROUP))]
