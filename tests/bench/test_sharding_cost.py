"""The simulated step of ZeRO stages 1-3 (bench/simulate/sharding_cost.py), against hand-computed figures (pure
Python, no TensorFlow)."""
import dataclasses

import pytest

from bench.simulate import sharding_cost
from bench.simulate.cluster_profile import Link, load_cluster_profile
from bench.simulate.step_model import predict_step

from bench_helpers import fake_profile

pytestmark = pytest.mark.timeout(60)
FREE = Link(0.0, 1e30)
WHOLE = 10 ** 15   # --shard-spread: every variable goes whole


def _cluster(**changes):
    values = dict(devices_per_node=1, max_nodes=64, intra=Link(1e-6, 1e9), inter=Link(1e-6, 1e9), reduce_Bps=1e30,
                  node_memory_Bps=0.0, host_link=FREE, host_copies=False, model_steps={}, relative_speed=1.0,
                  straggler_cv=0.0)
    values.update(changes)
    return dataclasses.replace(load_cluster_profile("hpc_da"), **values)


def test_with_free_links_each_stage_costs_its_compute():
    # 4 equal variables, one per layer: forward 0.03, backward 0.06, update 0.01 (fake_profile).
    profile = fake_profile(tensors=4, tensor_bytes=4_000_000)
    cluster = _cluster(intra=FREE, inter=FREE)
    assert predict_step(profile, cluster, 8, 4).step_s == pytest.approx(0.1)
    for shard in ("optimizer", "gradients"):   # a quarter of the update
        assert sharding_cost.predict_sharded_step(profile, cluster, 8, 4, shard).step_s == pytest.approx(0.0925)
    # stage 3 recomputes each layer's forward in its backward pass
    weights = sharding_cost.predict_sharded_step(profile, cluster, 8, 4, "weights")
    assert weights.step_s == pytest.approx(2 * 0.03 + 0.06 + 0.0025)
    assert weights.compute_s == pytest.approx(weights.step_s) and weights.buckets == 0
    # 8 ranks, 4 whole variables: the largest owner still updates a quarter
    assert sharding_cost.predict_sharded_step(profile, cluster, 8, 8, "optimizer").step_s == pytest.approx(0.0925)
    assert sharding_cost.predict_sharded_step(profile, cluster, 8, 1, "weights") == predict_step(profile, cluster,
                                                                                                   8, 1)


def test_a_gather_fans_out_from_the_owner_and_spreads_over_the_links():
    one_per_node = _cluster()
    kernel = sharding_cost._Variable(8_000_000, "dense", 1.0, owner=0)
    # whole: the owner sends 7 copies; the others each receive one
    assert sharding_cost._gather_time([kernel], 8, one_per_node, False, WHOLE) == pytest.approx(1e-6 + 7 * 8e6 / 1e9)
    # spread: the owner sends it once in 7 parts, each rank receives it once and relays 6/7 of it (two hops)
    assert sharding_cost._gather_time([kernel], 8, one_per_node, False, 0) == pytest.approx(2e-6 + 8e6 / 1e9)
    assert sharding_cost._gather_time([kernel], 2, one_per_node, False, 0) == pytest.approx(1e-6 + 8e6 / 1e9)
    # on one node (shared memory) nothing is spread
    one_node = _cluster(devices_per_node=8)
    assert sharding_cost._gather_time([kernel], 8, one_node, False, 0) == pytest.approx(1e-6 + 7 * 8e6 / 1e9)
    # two ranks per node, 4 ranks: a third of a rank's traffic stays on its node, two thirds leave it over the
    # interface both ranks of the node send through at once
    two_per_node = _cluster(devices_per_node=2, inter=Link(1e-6, 1e8))
    assert sharding_cost.spread_time(3e6, 4, two_per_node) == pytest.approx(max(1e-6 + 1e6 / 1e9,
                                                                                1e-6 + 2e6 * 2 / 1e8))


def test_stage_one_adds_the_hand_over_after_a_smaller_update():
    profile = fake_profile(tensors=4, tensor_bytes=4_000_000)
    cluster = _cluster()
    unsharded = predict_step(profile, cluster, 8, 4)
    sharded = sharding_cost.predict_sharded_step(profile, cluster, 8, 4, "optimizer", spread_bytes=WHOLE)
    # each rank owns one variable: sends it 3 times, receives the 3 it does not own
    handoff = 1e-6 + 3 * 4e6 / 1e9
    assert sharded.step_s == pytest.approx(unsharded.step_s - 0.01 + 0.0025 + handoff)
    assert sharded.communication_s == pytest.approx(unsharded.communication_s + handoff)


def test_whole_variables_grow_with_the_ranks_and_spread_ones_do_not():
    profile = fake_profile(tensors=4, tensor_bytes=4_000_000)
    cluster = _cluster()
    for shard in ("optimizer", "gradients", "weights"):
        whole = [sharding_cost.predict_sharded_step(profile, cluster, 8, n, shard, spread_bytes=WHOLE).step_s
                 for n in (2, 4, 8, 16)]
        spread = [sharding_cost.predict_sharded_step(profile, cluster, 8, n, shard, spread_bytes=0).step_s
                  for n in (2, 4, 8, 16)]
        assert whole == sorted(whole) and whole[-1] > 1.4 * whole[0], (shard, whole)
        assert spread[0] == whole[0] and max(spread) < 1.1 * spread[0], (shard, spread)
    with pytest.raises(ValueError, match="shard must be one of"):
        sharding_cost.predict_sharded_step(profile, cluster, 8, 2, "stage3")
