"""Time of one allreduce, per algorithm, mirroring csrc/engine/*_allreduce.cpp step by step.

Every algorithm is a sequence of exchange steps; a step ends when its slowest pair has
exchanged (latency + bytes / bandwidth, the link's bandwidth shared by the transfers
that leave the same node at once) plus the reduction of what was received. Ranks
are placed on nodes in order (rank r on node r // devices_per_node), as the launcher
places them.

    ring                2(p-1) steps of n/p bytes to the right neighbour
    recursive_doubling  fold to 2^k ranks, k steps of n bytes with partner r^mask, unfold
    rabenseifner        fold, k-1 halving steps (n/2, n/4, ...), one exchange of the last
                        range (2n/2^k), k-1 doubling steps, unfold
    shared_memory       rounds of 1 MiB: stage (p-1)/p, reduce own 1/p from p inputs,
                        gather (p-1)/p; 3 synchronisations per round (one node only)
    hierarchical        Note [Hierarchical allreduce] (hierarchical_allreduce.hpp): rounds of
                        4 MiB; per round a node-local reduce-scatter and allgather in shared
                        memory (costed as the shared_memory algorithm on the node's L ranks)
                        and, between them, L inter-node allreduces of a 1/L slice by the N
                        ranks of one local index, in parallel (flat auto choice over N ranks,
                        the node's network interface shared by its L concurrent transfers)
    auto                the engine's choice (csrc/engine/allreduce.cpp Allreducer::resolve):
                        shared_memory on one node; hierarchical for groups spanning several
                        nodes with the same number (> 1) of ranks on each; else
                        recursive_doubling below 64 KiB and for 2 ranks, rabenseifner for
                        2^k ranks, ring

Memory: copies and the summation of ranks on one node draw on the node's memory
bandwidth, so each runs at most at the rank's share of it (cluster.rank_memory_Bps).
"""
from __future__ import annotations

import dataclasses
import math

from bench.simulate.cluster_profile import ClusterProfile, Link

__all__ = ["ALGORITHMS", "choose_algorithm", "allreduce_time"]

ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical")
_SMALL_MESSAGE_BYTES = 64 * 1024      # allreduce.cpp kSmallMessageBytes
_SLOT_BYTES = 1 << 20                 # shared_memory_allreduce.hpp kSlotBytes
_HIERARCHICAL_SLOT_BYTES = 4 << 20    # hierarchical_allreduce.hpp kSlotBytes


def _nodes(ranks: int, cluster: ClusterProfile) -> int:
    return math.ceil(ranks / cluster.devices_per_node)


def choose_algorithm(nbytes: int, ranks: int, cluster: ClusterProfile) -> str:
    if _nodes(ranks, cluster) == 1:
        return "shared_memory"
    if cluster.ranks_on_node(ranks) > 1 and ranks % cluster.devices_per_node == 0:
        return "hierarchical"
    return _flat_choice(nbytes, ranks)


def _flat_choice(nbytes: int, ranks: int) -> str:
    if nbytes < _SMALL_MESSAGE_BYTES or ranks == 2:  # allreduce.cpp choose_flat: 2 ranks, one step
        return "recursive_doubling"
    return "rabenseifner" if ranks & (ranks - 1) == 0 else "ring"


def _step_time(pairs, nbytes: float, cluster: ClusterProfile, reduce: bool) -> float:
    """One exchange step among (sender, receiver) group ranks, each sending nbytes."""
    if not pairs:
        return 0.0
    dpn = cluster.devices_per_node
    leaving = {}
    for sender, receiver in pairs:
        if sender // dpn != receiver // dpn:
            leaving[sender // dpn] = leaving.get(sender // dpn, 0) + 1
    slowest = 0.0
    for sender, receiver in pairs:
        if sender // dpn != receiver // dpn:
            slowest = max(slowest, cluster.inter.time(nbytes, leaving[sender // dpn]))
        else:
            slowest = max(slowest, cluster.intra.time(nbytes))
    return slowest + (nbytes / _reduce_Bps(cluster, len(pairs)) if reduce else 0.0)


def _reduce_Bps(cluster: ClusterProfile, ranks: int) -> float:
    """The summation kernel, at most at the rank's share of its node's memory bandwidth."""
    return min(cluster.reduce_Bps, cluster.rank_memory_Bps(cluster.ranks_on_node(ranks)))


def _fold(ranks: int):
    core = 1 << (ranks.bit_length() - 1)
    remainder = ranks - core
    group_rank = [2 * c + 1 if c < remainder else c + remainder for c in range(core)]
    fold_pairs = [(2 * i, 2 * i + 1) for i in range(remainder)]
    return core, group_rank, fold_pairs


def _ring(nbytes, ranks, cluster):
    pairs = [(r, (r + 1) % ranks) for r in range(ranks)]
    chunk = math.ceil(nbytes / ranks)
    return (ranks - 1) * (_step_time(pairs, chunk, cluster, True) + _step_time(pairs, chunk, cluster, False))


def _butterfly(nbytes, ranks, cluster, halving: bool):
    core, group_rank, fold_pairs = _fold(ranks)
    total = 2 * _step_time(fold_pairs, nbytes, cluster, False) if fold_pairs else 0.0
    if fold_pairs:
        total += nbytes / _reduce_Bps(cluster, ranks)
    masks = []
    mask = 1
    while mask < core:
        masks.append(mask)
        mask <<= 1

    def pairs(m):
        return [(group_rank[c], group_rank[c ^ m]) for c in range(core)]

    if not halving:
        return total + sum(_step_time(pairs(m), nbytes, cluster, True) for m in masks)
    if not masks:                       # one rank
        return total
    size = nbytes
    for m in reversed(masks[1:]):       # reduce-scatter: n/2, n/4, ... 2n/core
        size /= 2
        total += _step_time(pairs(m), size, cluster, True)
    # The last halving and the first allgather step are one exchange of the last range
    # (Note [The last halving and the first doubling in one step], rabenseifner_allreduce.cpp).
    total += _step_time(pairs(masks[0]), size, cluster, True)
    for m in masks[1:]:                 # allgather retraces: 2n/core ... n/2
        total += _step_time(pairs(m), size, cluster, False)
        size *= 2
    return total


def _shared_memory(nbytes, ranks, cluster):
    rounds = max(1, math.ceil(nbytes / _SLOT_BYTES))
    copied = nbytes * (2 * (ranks - 1) / ranks + 1 / ranks)
    bandwidth = min(cluster.intra.bandwidth_Bps, cluster.rank_memory_Bps(ranks))
    return (3 * rounds * cluster.intra.latency_s + copied / bandwidth
            + nbytes / _reduce_Bps(cluster, ranks))


def _hierarchical(nbytes, ranks, cluster):
    local = cluster.ranks_on_node(ranks)
    nodes = _nodes(ranks, cluster)
    rounds = max(1, math.ceil(nbytes / _HIERARCHICAL_SLOT_BYTES))
    slice_bytes = nbytes / rounds / local
    # The L slices cross the network at once: one rank per node each, sharing its interface.
    peers = dataclasses.replace(cluster, devices_per_node=1, max_nodes=nodes,
                                inter=Link(cluster.inter.latency_s, cluster.inter.bandwidth_Bps / local))
    across = rounds * allreduce_time(slice_bytes, nodes, peers, _flat_choice(slice_bytes, nodes))
    return _shared_memory(nbytes, local, cluster) + across


def allreduce_time(nbytes: int, ranks: int, cluster: ClusterProfile, algorithm: str = "auto") -> float:
    """Seconds for one allreduce of `nbytes` over `ranks` ranks of `cluster`."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if algorithm == "auto":
        algorithm = choose_algorithm(nbytes, ranks, cluster)
    if algorithm == "hierarchical":
        return _hierarchical(nbytes, ranks, cluster)
    if algorithm == "shared_memory":
        return _shared_memory(nbytes, ranks, cluster)
    if algorithm == "ring":
        return _ring(nbytes, ranks, cluster)
    if algorithm == "recursive_doubling":
        return _butterfly(nbytes, ranks, cluster, halving=False)
    if algorithm == "rabenseifner":
        return _butterfly(nbytes, ranks, cluster, halving=True)
    raise ValueError(f"unknown algorithm {algorithm!r}")
