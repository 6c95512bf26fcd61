"""Each cost of a simulated step, against hand-computed figures (pure Python, no TensorFlow)."""
import dataclasses
import math

import pytest

from bench.errors import BenchUsageError
from bench.simulate.allreduce_cost import allreduce_time
from bench.simulate.cluster_profile import Link, load_cluster_profile
from bench.simulate.compute_model import rank_compute
from bench.simulate.step_model import lay_out_buckets, predict_step, straggler_cv
from bench.simulate.stragglers import expected_max_standard_normal, measured_cv, straggler_factor

from bench_helpers import fake_profile

pytestmark = pytest.mark.timeout(60)


def _one_bucket_profile(nbytes=8_000_000, ready=1.0, **changes):
    profile = fake_profile(tensors=1, tensor_bytes=nbytes)
    profile["gradients"][0]["ready_fraction"] = ready
    profile.update(changes)
    return profile


def _gpu(**changes):
    base = load_cluster_profile("hpc_da")
    values = dict(devices_per_node=1, max_nodes=64, intra=Link(1e-6, 10e9), inter=Link(1e-6, 1e9),
                  reduce_Bps=1e30, node_memory_Bps=0.0, host_link=Link(0.0, 2e9), model_steps={},
                  relative_speed=1.0, straggler_cv=0.0)
    values.update(changes)
    return dataclasses.replace(base, **values)


def test_expected_maximum_of_normal_draws():
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    values = [expected_max_standard_normal(n) for n in (2, 8, 64, 512)]
    assert values == sorted(values) and values[-1] == pytest.approx(3.04, abs=0.01)
    assert straggler_factor(0.1, 2) == pytest.approx(1 + 0.1 / math.sqrt(math.pi), rel=1e-4)
    assert measured_cv([1.0] * 6) == 0.0 and measured_cv([0.9, 1.1]) == 0.0   # too few steps: unknown
    assert measured_cv([0.9, 1.1] * 3) == pytest.approx(0.1)


def test_stragglers_come_from_the_measured_run_unless_the_profile_states_them():
    profile = _one_bucket_profile(step_times_s=[0.09, 0.11] * 3)
    cluster = _gpu(straggler_cv=None)
    assert straggler_cv(profile, cluster) == pytest.approx(0.1)
    assert straggler_cv(profile, _gpu(straggler_cv=0.03)) == 0.03
    assert predict_step(profile, cluster, 8, 1).straggler_factor == 1.0
    many = predict_step(profile, cluster, 8, 64, exchange_gradients=False)
    assert many.straggler_factor == pytest.approx(1 + 0.1 * expected_max_standard_normal(64))
    assert many.step_s == pytest.approx(0.1 * many.straggler_factor)


def test_host_copies_and_exposed_communication_after_the_last_bucket():
    # One bucket, ready at the end of backprop: the step waits for copy out, allreduce, copy back.
    profile = _one_bucket_profile()
    cluster = _gpu()
    allreduce = allreduce_time(8_000_000, 4, cluster, "ring")
    copy = 8_000_000 / 2e9
    step = predict_step(profile, cluster, 8, 4, algorithm="ring")
    assert step.copy_s == pytest.approx(2 * copy)
    assert step.step_s == pytest.approx(0.1 + 2 * copy + allreduce)
    assert step.exposed_communication_s == pytest.approx(2 * copy + allreduce)
    no_copies = predict_step(profile, dataclasses.replace(cluster, host_copies=False), 8, 4, algorithm="ring")
    assert no_copies.step_s == pytest.approx(0.1 + allreduce) and no_copies.copy_s == 0.0


def test_global_batch_norm_statistics_stop_compute_for_each_allreduce():
    # Two layers at 4 devices: C = 64 gathers 4 x 129 values forward; C = 4096 exceeds 16 Ki values, so two
    # passes (4097 and 4096 values); each takes one backward allreduce of 2C values. All blocking.
    profile = _one_bucket_profile(batch_norm=[{"layer": "bn", "channels": 64}, {"layer": "bn_1", "channels": 4096}])
    cluster = _gpu()
    cost = lambda values: allreduce_time(4 * values, 4, cluster, "ring")  # noqa: E731
    statistics = cost(4 * 129) + cost(4097) + cost(4096) + cost(128) + cost(8192)
    step = predict_step(profile, cluster, 8, 4, algorithm="ring")
    plain = predict_step(profile, cluster, 8, 4, algorithm="ring", global_batch_norm=False)
    assert step.statistics_allreduces == 5 and step.statistics_s == pytest.approx(statistics)
    assert step.step_s == pytest.approx(plain.step_s + statistics)
    assert step.compute_s == pytest.approx(plain.compute_s)  # communication, not compute
    assert plain.statistics_s == 0.0 and plain.statistics_allreduces == 0
    one = predict_step(profile, cluster, 8, 1, algorithm="ring")
    assert one.statistics_allreduces == 0  # one device: Keras's own statistics


def test_precision_divides_compute_by_the_devices_stated_speed():
    """Note [Precision of a simulated device]: float32 is 1; a stated speed divides the step; a profile
    measured here in bfloat16 is first made float32 with the measuring machine's speed."""
    cluster = _gpu(precision_speed={"mixed_float16": 3.0})
    profile = _one_bucket_profile()
    full = rank_compute(profile, cluster, 8, 1)
    fast = rank_compute(profile, cluster, 8, 1, precision="mixed_float16")
    assert fast.step_s == pytest.approx(full.step_s / 3.0)
    assert predict_step(profile, cluster, 8, 1, precision="mixed_float16").step_s == pytest.approx(full.step_s / 3)
    with pytest.raises(BenchUsageError, match="states no mixed_bfloat16 throughput.*compute.precision"):
        rank_compute(profile, cluster, 8, 1, precision="mixed_bfloat16")
    measured_in_bf16 = dict(profile, precision="mixed_bfloat16")
    measuring = dataclasses.replace(cluster, precision_speed={"mixed_bfloat16": 1.5})
    bf16_cluster = dataclasses.replace(cluster, precision_speed={"mixed_bfloat16": 6.0})
    simulated = rank_compute(measured_in_bf16, bf16_cluster, 8, 1, precision="mixed_bfloat16", measuring=measuring)
    assert simulated.step_s == pytest.approx(full.step_s * 1.5 / 6.0)


def test_buckets_ready_early_are_hidden_behind_backprop():
    early = predict_step(_one_bucket_profile(ready=0.1), _gpu(), 8, 4, algorithm="ring")
    late = predict_step(_one_bucket_profile(ready=1.0), _gpu(), 8, 4, algorithm="ring")
    assert early.exposed_communication_s < late.exposed_communication_s
    # backward = 0.06 s: a bucket ready at 10% has 0.054 s of backprop to hide behind
    assert early.exposed_communication_s == pytest.approx(
        max(0.0, late.exposed_communication_s - 0.9 * 0.06))
    without = predict_step(_one_bucket_profile(ready=0.1), dataclasses.replace(_gpu(), overlap=False), 8, 4,
                           algorithm="ring")
    assert without.step_s == pytest.approx(late.step_s)


def test_a_cpu_device_is_a_process_with_its_share_of_the_cores():
    cluster = load_cluster_profile("this_machine")        # 2 cores
    profile = fake_profile()                               # measured with 2 threads: 0.1 s, fixed 0.02
    profile["threads"] = 2
    one = rank_compute(profile, cluster, 8, 1)
    assert one.step_s == pytest.approx(0.1)                # the run used both cores: reproduced
    two = rank_compute(profile, cluster, 8, 2)             # one core each: per-example work x2
    assert two.step_s == pytest.approx(0.02 + 2 * 0.08)
    four = rank_compute(profile, cluster, 8, 4)            # half a core each: all of it slower
    assert four.step_s == pytest.approx(2 * 0.02 + 4 * 0.08)
    profile["threads"] = 1                                 # a 1-thread run: each core does its part
    assert rank_compute(profile, cluster, 8, 1).step_s == pytest.approx(0.02 + 0.08 / 2)


def test_cpu_cluster_shares_a_node_among_its_ranks_and_scales_by_core_speed():
    cluster = load_cluster_profile("supermuc_ng")          # 48 cores, 4 ranks per node
    speed = cluster.core_speed
    profile = fake_profile()
    profile["threads"] = 2
    one = rank_compute(profile, cluster, 8, 1)             # the published baseline: one process, the whole node
    assert one.step_s == pytest.approx(0.02 / speed + 0.08 * 2 / (48 * speed))
    assert rank_compute(profile, cluster, 8, 2).step_s == pytest.approx(0.02 / speed + 0.08 * 2 / (24 * speed))
    four = rank_compute(profile, cluster, 8, 4)
    assert four.step_s == pytest.approx(0.02 / speed + 0.08 * 2 / (12 * speed))
    assert rank_compute(profile, cluster, 8, 256).step_s == pytest.approx(four.step_s)   # 64 nodes of 4


def test_node_memory_bandwidth_is_shared_by_its_ranks():
    cluster = dataclasses.replace(load_cluster_profile("this_machine"), node_memory_Bps=40e9,
                                  core_memory_Bps=30e9, straggler_cv=0.0)
    assert cluster.rank_memory_Bps(1) == 30e9 and cluster.rank_memory_Bps(2) == 20e9
    assert cluster.rank_memory_Bps(4) == 10e9
    profile = _one_bucket_profile()
    step = predict_step(profile, cluster, 8, 2)
    assert step.copy_s == pytest.approx(2 * 8_000_000 / 20e9)


def test_input_pipeline_cost():
    cpu = dataclasses.replace(load_cluster_profile("this_machine"), input_core_s_per_example=0.001,
                              straggler_cv=0.0)
    profile = fake_profile()
    profile["threads"] = 2
    synthetic = predict_step(profile, cpu, 8, 1)
    real = predict_step(profile, cpu, 8, 1, real_data=True)
    assert real.input_s == pytest.approx(8 * 0.001 / 2)     # 2 cores feed the one rank
    assert real.step_s == pytest.approx(synthetic.step_s + real.input_s)   # same cores: added
    gpu = _gpu(input_core_s_per_example=0.001, input_cores_per_node=1.0)
    hidden = predict_step(profile, gpu, 8, 1, real_data=True)
    assert hidden.step_s == pytest.approx(0.1)             # 8 ms of input behind 100 ms of compute
    slow = predict_step(profile, dataclasses.replace(gpu, input_core_s_per_example=0.05), 8, 1, real_data=True)
    assert slow.step_s == pytest.approx(0.4)               # 400 ms of input: it sets the pace


def test_a_rank_that_shards_after_the_decode_decodes_the_global_batch():
    """Note [Sharding after the decode]: the original's ranks each decode N micro-batches to keep one."""
    cpu = dataclasses.replace(load_cluster_profile("supermuc_ng"), input_core_s_per_example=0.001, straggler_cv=0.0)
    profile = fake_profile()
    profile["threads"] = 2
    own = predict_step(profile, cpu, 8, 64, real_data=True)
    after = predict_step(profile, cpu, 8, 64, real_data=True, shard_after_decode=True)
    assert own.input_s == pytest.approx(8 * 0.001 / 12)           # 4 ranks a node: 12 cores feed each
    assert after.input_s == pytest.approx(64 * 8 * 0.001 / 12)    # 64 micro-batches decoded for one kept
    assert predict_step(profile, cpu, 8, 1, real_data=True, shard_after_decode=True).input_s == pytest.approx(
        predict_step(profile, cpu, 8, 1, real_data=True).input_s)   # alone, the same pipeline
    assert predict_step(profile, cpu, 8, 64, shard_after_decode=True).input_s == 0.0   # synthetic: nothing decoded


def test_weak_and_strong_scaling_and_published_throughput():
    cluster = load_cluster_profile("hpc_da")
    profile = fake_profile(model="resnet50")
    published = cluster.model_steps["resnet50"]
    weak = predict_step(profile, cluster, 2 * published.micro_batch, 1)
    assert weak.compute_s == pytest.approx(2 * published.micro_batch / published.examples_per_s)  # scaled linearly
    assert weak.compute_source == "published"
    strong = predict_step(profile, cluster, 64, 2)          # global 128 over 2 devices
    assert strong.compute_s < weak.compute_s


def test_efficiency_falls_with_scale_on_a_real_profile():
    # Not linear by construction: copies, latency steps, shared links and stragglers all grow.
    cluster = load_cluster_profile("hpc_da")
    profile = fake_profile(model="resnet50", tensors=160, tensor_bytes=640_000)   # ~100 MB
    profile["step_times_s"] = [0.098, 0.1, 0.102, 0.1, 0.1]
    one = predict_step(profile, cluster, 64, 1).step_s
    efficiencies = [one / predict_step(profile, cluster, 64, n).step_s for n in (6, 24, 96)]
    assert all(e < 1.0 for e in efficiencies)
    assert efficiencies == sorted(efficiencies, reverse=True)


def test_namespace_hosts_share_one_machine_and_talk_tcp():
    cluster = dataclasses.replace(load_cluster_profile("netns_cluster"), straggler_cv=0.0)
    assert cluster.devices_per_node == 1 and cluster.one_machine
    profile = fake_profile()
    profile["threads"] = 2
    # two hosts of one rank each still split the machine's 2 cores
    assert rank_compute(profile, cluster, 8, 2).step_s == pytest.approx(0.02 + 2 * 0.08)
    two = predict_step(profile, cluster, 8, 2)
    buckets = lay_out_buckets(profile["gradients"], cluster.fusion_threshold_bytes)
    assert [b.nbytes for b in buckets] == [40_000] * 20
    assert two.algorithm == "recursive_doubling"    # one rank per host, below 64 KiB: flat, over TCP
    # one exchange step per bucket: a TCP latency, the bucket over the link, its summation
    one = cluster.inter.latency_s + 40_000 / cluster.inter.bandwidth_Bps + 40_000 / cluster.reduce_Bps
    assert two.communication_s == pytest.approx(20 * one)


def test_launcher_arguments_of_a_namespace_cluster_reach_the_launcher():
    from bench.sweep.options import SweepOptions
    from bench.sweep.runner import launch_command
    options = SweepOptions(model="resnet_tiny", counts=[1, 2], hostfile="/h", launch_agent="/a agent",
                           network_interface="10.213.3.0/24")
    command = launch_command(options, 2, 8)
    at = command.index("--hostfile")
    assert command[at:at + 6] == ["--hostfile", "/h", "--launch-agent", "/a agent", "--network-interface",
                                  "10.213.3.0/24"]
