"""The simulation's allreduce cost models against hand-computed alpha-beta figures."""
import dataclasses
import math

import pytest

from bench.simulate.allreduce_cost import allreduce_time, choose_algorithm
from bench.simulate.cluster_profile import Link, load_cluster_profile

pytestmark = pytest.mark.timeout(30)


def _cluster(devices_per_node=4, intra=(1e-6, 10e9), inter=(10e-6, 1e9), reduce_Bps=1e30):
    base = load_cluster_profile("hpc_da")
    return dataclasses.replace(base, devices_per_node=devices_per_node, max_nodes=64,
                               intra=Link(*intra), inter=Link(*inter), reduce_Bps=reduce_Bps,
                               node_memory_Bps=0.0)


def test_one_rank_costs_nothing():
    assert allreduce_time(1 << 20, 1, _cluster()) == 0.0


def test_auto_choice_mirrors_the_engine():
    cluster = _cluster(devices_per_node=4)
    assert choose_algorithm(1 << 30, 4, cluster) == "shared_memory"      # one node
    assert choose_algorithm(1024, 8, cluster) == "hierarchical"          # nodes with several ranks
    one_per_node = _cluster(devices_per_node=1)
    assert choose_algorithm(1024, 8, one_per_node) == "recursive_doubling"    # small, across nodes
    assert choose_algorithm(1 << 20, 8, one_per_node) == "rabenseifner"       # large, 2^k ranks
    assert choose_algorithm(1 << 20, 12, one_per_node) == "ring"              # large, other counts
    assert choose_algorithm(1 << 20, 2, one_per_node) == "recursive_doubling"  # 2 ranks: one step


def test_hierarchical_is_node_reduce_scatter_parallel_slices_across_nodes_node_allgather():
    cluster = _cluster(devices_per_node=4)
    n = 8 << 20                                         # 2 rounds of 4 MiB, slices of 1 MiB
    peers = _cluster(devices_per_node=1, inter=(10e-6, 1e9 / 4))   # 4 slices share each interface
    # 2 nodes: the slices go by recursive doubling (the engine's flat choice for 2 ranks)
    expected = allreduce_time(n, 4, cluster, "shared_memory") + 2 * allreduce_time(1 << 20, 2, peers,
                                                                                   "recursive_doubling")
    assert allreduce_time(n, 8, cluster, "hierarchical") == pytest.approx(expected)
    # each node's link carries the message once each way: cheaper than the flat algorithms
    assert allreduce_time(n, 8, cluster) < allreduce_time(n, 8, cluster, "rabenseifner")
    assert choose_algorithm(n, 6, cluster) == "ring"    # 4 + 2 ranks per node: flat, as the engine


def test_latency_is_paid_once_per_step_of_the_algorithm():
    cluster = _cluster(devices_per_node=1)
    for p in (4, 8, 16):
        assert allreduce_time(4 * p, p, cluster, "ring") == pytest.approx(2 * (p - 1) * 10e-6, rel=1e-3)
        steps = int(math.log2(p))
        assert allreduce_time(4 * p, p, cluster, "recursive_doubling") == pytest.approx(steps * 10e-6, rel=1e-2)
        # The last halving and the first allgather step are one exchange (rabenseifner_allreduce.cpp).
        assert allreduce_time(4 * p, p, cluster, "rabenseifner") == pytest.approx((2 * steps - 1) * 10e-6, rel=1e-2)


def test_ring_across_nodes_is_alpha_beta():
    # 1 rank per node: every step crosses nodes, one transfer leaves each node.
    cluster = _cluster(devices_per_node=1)
    n, p = 8_000_000, 4
    expected = 2 * (p - 1) * (10e-6 + (n / p) / 1e9)
    assert allreduce_time(n, p, cluster, "ring") == pytest.approx(expected)


def test_recursive_doubling_shares_the_node_link():
    # 2 ranks per node, 4 ranks: the first step stays on the node, the second sends both
    # ranks' full vectors off the node at once (sharing its link).
    cluster = _cluster(devices_per_node=2)
    n = 1_000_000
    expected = (1e-6 + n / 10e9) + (10e-6 + 2 * n / 1e9)
    assert allreduce_time(n, 4, cluster, "recursive_doubling") == pytest.approx(expected)


def test_rabenseifner_moves_less_than_recursive_doubling_for_large_messages():
    cluster = _cluster(devices_per_node=1)
    n = 64 << 20
    assert allreduce_time(n, 16, cluster, "rabenseifner") < allreduce_time(n, 16, cluster, "recursive_doubling")
    # and costs about the ring's bandwidth term 2 (p-1)/p n / beta
    assert allreduce_time(n, 16, cluster, "rabenseifner") == pytest.approx(2 * 15 / 16 * n / 1e9, rel=0.01)


def test_non_power_of_two_folds():
    cluster = _cluster(devices_per_node=1)
    n = 1 << 20
    # 6 ranks: fold in and out (2 full transfers) around a 4-rank recursive doubling.
    folded = allreduce_time(n, 6, cluster, "recursive_doubling")
    core = allreduce_time(n, 4, cluster, "recursive_doubling")
    assert folded == pytest.approx(core + 2 * (10e-6 + n / 1e9))


def test_shared_memory_rounds():
    cluster = _cluster(devices_per_node=8)
    n, p = 3 << 20, 4                           # 3 rounds of 1 MiB
    expected = 3 * 3 * 1e-6 + n * (2 * 3 / 4 + 1 / 4) / 10e9
    assert allreduce_time(n, p, cluster, "shared_memory") == pytest.approx(expected)


def test_costs_grow_with_size_and_ranks():
    cluster = load_cluster_profile("supermuc_ng")
    sizes = [1 << k for k in range(10, 28, 3)]
    for ranks in (2, 6, 16, 96):
        times = [allreduce_time(s, ranks, cluster) for s in sizes]
        assert all(t > 0 and math.isfinite(t) for t in times)
        assert times == sorted(times)
