"""Collectives on numpy arrays: allreduce, broadcast, allgather, barrier.

Every rank of the group must call the same collective, in the same order,
with arrays of the same size and dtype (allgather and the object variants
excepted); otherwise every rank raises tnt.MismatchError or, after
TNT_TIMEOUT_SECONDS, a TimeoutError naming the ranks not heard from. An
allreduce checks the ranks' calls alongside its data exchange when the group
spans nodes (no extra round trip; with one rank per node the call rides in the
messages' tags, no extra message either): a mismatch found there has moved
data, so it also fails the group (below).

After a timeout or an MPI error the group has failed, together with every
group split from the same world: each later collective raises
tarantella.errors.GroupFailedError at once, naming the first failure, because
peers may be gone or out of step and no result could be trusted. End the job
then (and restart it from a checkpoint).

Closing: `Group.close()` frees a sub-group's shared-memory segments; it is
collective (every rank of the group calls it at the same point). A group that
is only dropped and garbage-collected frees nothing collective (a garbage
collector runs at a different moment on every rank): its segments go with
MPI at exit.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from tarantella import runtime

__all__ = ["Group", "allreduce", "broadcast", "allgather", "barrier", "broadcast_object", "allgather_object"]


class Group:
    """A set of ranks running collectives together (the world, or a split of it).

    Wraps the engine's handle (`_engine.GroupHandle`: its process group and allreducer)."""

    def __init__(self, handle):
        self._handle = handle

    @classmethod
    def world(cls) -> "Group":
        return cls(runtime.world_group())

    @property
    def rank(self) -> int:
        return self._handle.rank

    @property
    def size(self) -> int:
        return self._handle.size

    def world_rank_of(self, rank: int) -> int:
        return self._handle.world_rank_of(rank)

    @property
    def node_count(self) -> int:
        """The nodes (hosts) the group's ranks run on."""
        return self._handle.node_count

    @property
    def local_rank(self) -> int:
        """This rank's index among the group's ranks on its node."""
        return self._handle.local_rank

    @property
    def local_size(self) -> int:
        """The group's ranks on this rank's node."""
        return self._handle.local_size

    @property
    def failed(self) -> bool:
        """True once a collective of this group (or of its family) timed out or failed in MPI."""
        return self._handle.failed

    def close(self) -> None:
        """Free the group's shared segments. Collective; later calls on the group raise ValueError.
        The world group closes at exit only."""
        self._handle.close()

    def split(self, color: int, key: int | None = None) -> "Group":
        """A sub-group of the ranks that pass the same `color`, ordered by `key` (default: rank). Collective."""
        return Group(self._handle.split(color, self.rank if key is None else key))

    def __repr__(self) -> str:
        return f"Group(rank={self.rank}, size={self.size})"


def _handle(group: Group | None):
    return runtime.world_group() if group is None else group._handle


def allreduce(array, op: str = "sum", algorithm: str | None = None, out: np.ndarray | None = None,
              group: Group | None = None) -> np.ndarray:
    """Reduce `array` element-wise over all ranks; every rank gets the result.

    op: "sum", "average", "min" or "max". algorithm: "auto" (default: the
    configured TNT_ALLREDUCE_ALGORITHM), "ring", "recursive_doubling",
    "rabenseifner", "shared_memory" (ranks on one node), "hierarchical"
    (node-local reduce-scatter through shared memory, inter-node allreduce of
    each slice by the ranks of one local index in parallel, node-local
    allgather) or "mpi". `auto` takes shared_memory on one node, hierarchical
    when the group spans nodes with the same number (> 1) of ranks on each,
    else a flat algorithm by size (recursive doubling below 64 KiB, then
    Rabenseifner or ring). "hierarchical" with unequal ranks per node, or one
    per node, falls back to that flat choice on every rank alike.
    Results are bitwise identical on all ranks and across runs. min and max
    propagate NaN and order -0 below +0, so they too agree bit for bit.
    Integer averages truncate toward zero.
    """
    from tarantella import _engine
    chosen = algorithm if algorithm is not None else runtime.settings().allreduce_algorithm
    data = np.asarray(array)
    return _engine.allreduce(data, out, op, chosen, _handle(group))


def broadcast(array, root: int = 0, group: Group | None = None) -> np.ndarray:
    """Every rank gets root's `array` (in place when `array` is a writable C-contiguous array)."""
    from tarantella import _engine
    data = np.asarray(array)
    result = _engine.broadcast(data, root, _handle(group))
    if result is not data and isinstance(array, np.ndarray) and array.flags.writeable:
        array[...] = result.reshape(array.shape)
        return array
    return result


def allgather(array, group: Group | None = None) -> np.ndarray:
    """Stack every rank's `array` (same shape and dtype on all ranks) along a new first axis."""
    from tarantella import _engine
    return _engine.allgather(np.asarray(array), _handle(group))


def barrier(group: Group | None = None) -> None:
    _handle(group).barrier()


def allgather_object(value: Any, group: Group | None = None) -> list:
    """Every rank's picklable `value`, in rank order."""
    from tarantella import _engine
    blocks = _engine.allgather_bytes(pickle.dumps(value), _handle(group))
    return [pickle.loads(block) for block in blocks]


def broadcast_object(value: Any, root: int = 0, group: Group | None = None) -> Any:
    """Root's picklable `value` on every rank."""
    return allgather_object(value if _handle(group).rank == root else None, group)[root]
