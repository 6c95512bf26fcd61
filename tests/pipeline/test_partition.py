"""Partitioning, placement, schedules and balanced cuts: pure logic, one process."""
import keras
import numpy as np
import pytest

from tarantella.keras.layers import SplitLayer
from tarantella.pipelining import balance
from tarantella.pipelining.partition import graph_of, partition, stages_from_split_layers
from tarantella.pipelining.schedules import (BACKWARD, FORWARD, WEIGHT, check_micro_batches, deferred_schedule, gpipe,
                                           ideal_bubble_fraction, max_live_micro_batches, one_f_one_b, schedule,
                                           with_weight_passes)
from tarantella.pipelining.topology import place


def two_cut_model():
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    h1 = keras.layers.Dense(8, name="d1")(a)
    h2 = keras.layers.Dense(8, name="d2")(b)
    early = keras.layers.Dense(1, name="early")(h1)                 # an output of stage 0
    h1, h2 = SplitLayer(name="s1a")(h1), SplitLayer(name="s1b")(h2)  # two tensors cross cut 1
    h = keras.layers.Concatenate(name="cat")([h1, h2])
    h = SplitLayer(name="s2")(keras.layers.Dense(8, name="d3")(h))
    out = keras.layers.Dense(2, name="out")(keras.layers.Concatenate(name="cat2")([h, h2]))  # h2 skips stage 1
    return keras.Model([a, b], [out, early])


def test_split_layers_define_stages_and_crossing_tensors():
    model = two_cut_model()
    graph = graph_of(model)
    stages = stages_from_split_layers(graph)
    by_name = {op.name: s for op, s in zip(graph.operations, stages)}
    assert by_name["d1"] == by_name["s1a"] == by_name["early"] == 0
    assert by_name["cat"] == by_name["d3"] == by_name["s2"] == 1
    assert by_name["out"] == by_name["cat2"] == 2
    plan = partition(model, graph, stages, 3)
    routes = sorted((e.source, e.target) for e in plan.edges)
    # s1a -> 1, s1b -> 1 and -> 2 (straight to its consumer), s2 -> 2, early output -> 2.
    assert routes == [(0, 1), (0, 1), (0, 2), (0, 2), (1, 2)]
    assert [kind for kind, _ in plan.stages[2].model_outputs] == ["computed", "received"]
    x = [np.ones((3, 6), "float32"), np.ones((3, 4), "float32")]
    expected = model(x)
    stage0 = plan.stages[0].model(x)
    values = {}
    for out, edges in zip(stage0, plan.stages[0].output_edges):
        values.update({e: out for e in edges})
    stage1 = plan.stages[1].model([values[e] for e in plan.stages[1].input_edges])
    for out, edges in zip([stage1] if not isinstance(stage1, list) else stage1, plan.stages[1].output_edges):
        values.update({e: out for e in edges})
    stage2 = plan.stages[2].model([values[e] for e in plan.stages[2].input_edges])
    stage2 = stage2 if isinstance(stage2, list) else [stage2]
    final = [stage2[i] if kind == "computed" else values[i] for kind, i in plan.stages[2].model_outputs]
    for got, want in zip(final, expected):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    # The stages share the user's layer objects: no copies of weights.
    assert plan.stages[1].model.get_layer("d3") is model.get_layer("d3")


def test_only_the_asked_stage_is_built():
    model = two_cut_model()
    graph = graph_of(model)
    plan = partition(model, graph, stages_from_split_layers(graph), 3, build_stage=1)
    assert plan.stages[0].model is None and plan.stages[2].model is None
    assert {layer.name for layer in plan.stages[1].model.layers} >= {"cat", "d3", "s2"}


def test_split_layer_with_two_inputs_is_refused_when_built():
    a, b = keras.Input((4,)), keras.Input((4,))
    with pytest.raises(ValueError, match="exactly one input"):
        SplitLayer(name="bad")([a, b])


def test_a_split_layer_inside_a_nested_model_is_refused():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), SplitLayer(name="inside"),
                              keras.layers.Dense(2)], name="inner")
    x = keras.Input((4,))
    with pytest.raises(ValueError, match="SplitLayer 'inside' is inside the nested model 'inner'"):
        graph_of(keras.Model(x, inner(x)))


def test_a_layer_shared_across_a_cut_is_refused():
    shared = keras.layers.Dense(4, name="shared")
    x = keras.Input((4,))
    out = shared(SplitLayer(name="cut")(shared(x)))
    with pytest.raises(ValueError, match="layer 'shared' is called 2 times in the model"):
        graph_of(keras.Model(x, out))


def test_a_micro_batch_count_must_divide_the_batch():
    check_micro_batches(16, 2, 4)
    with pytest.raises(ValueError, match="global batch of 12 samples does not split into 2 replicas x 4"):
        check_micro_batches(12, 2, 4)


def test_inputs_must_be_read_by_the_first_stage():
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    h = SplitLayer()(keras.layers.Dense(4, name="d")(a))
    out = keras.layers.Concatenate(name="late")([h, b])
    model = keras.Model([a, b], out)
    graph = graph_of(model)
    with pytest.raises(ValueError, match="'late' in pipeline stage 1 reads the model input"):
        partition(model, graph, stages_from_split_layers(graph), 2)


def test_stage_count_must_divide_the_ranks():
    with pytest.raises(ValueError, match="3 pipeline stages do not divide the 4 ranks"):
        place(0, 4, 3, data_parallel=True)
    with pytest.raises(ValueError, match="ParallelStrategy.ALL"):
        place(0, 4, 2, data_parallel=False)
    p = place(5, 6, 3)
    assert (p.replica, p.stage, p.num_replicas, p.peer(0)) == (1, 2, 2, 3)


@pytest.mark.parametrize("stages,micro", [(1, 1), (2, 4), (4, 4), (4, 8), (3, 2)])
def test_schedules_run_every_pass_once_in_dependency_order(stages, micro):
    for make in (gpipe, one_f_one_b):
        for stage in range(stages):
            passes = make(micro, stages, stage)
            assert sorted(passes) == sorted([(FORWARD, m) for m in range(micro)] + [(BACKWARD, m) for m in range(micro)])
            for m in range(micro):
                assert passes.index((FORWARD, m)) < passes.index((BACKWARD, m))
            assert [m for k, m in passes if k == BACKWARD] == list(range(micro))
    # 1F1B bounds live activations by the stages still ahead; GPipe holds them all.
    assert max_live_micro_batches(one_f_one_b(micro, stages, 0)) == min(stages, micro)
    assert max_live_micro_batches(gpipe(micro, stages, 0)) == micro


def test_one_f_one_b_shape():
    assert one_f_one_b(4, 2, 0) == [(FORWARD, 0), (FORWARD, 1), (BACKWARD, 0), (FORWARD, 2), (BACKWARD, 1),
                                    (FORWARD, 3), (BACKWARD, 2), (BACKWARD, 3)]
    assert ideal_bubble_fraction(4, 2) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule("pipedream", 4, 2, 0)


def test_weight_passes_follow_their_backwards_and_count_as_held():
    passes = with_weight_passes(one_f_one_b(4, 2, 0), 2)
    assert passes == [(FORWARD, 0), (FORWARD, 1), (BACKWARD, 0), (FORWARD, 2), (BACKWARD, 1), (WEIGHT, 1),
                      (FORWARD, 3), (BACKWARD, 2), (BACKWARD, 3), (WEIGHT, 3)]
    # A deferred micro-batch is held (its layer inputs and output gradients) until its weight pass.
    assert max_live_micro_batches(passes) == 3
    assert max_live_micro_batches(with_weight_passes(one_f_one_b(8, 2, 0), 8)) == 8
    assert with_weight_passes(gpipe(4, 2, 1), 4)[-2:] == [(BACKWARD, 3), (WEIGHT, 3)]
    assert with_weight_passes(gpipe(3, 2, 1), 2)[-3:] == [(WEIGHT, 1), (BACKWARD, 2), (WEIGHT, 2)]


def test_one_f_one_b_defers_weight_gradients_only_where_that_holds_less_than_they_take():
    from tarantella.pipelining.weight_gradients import defer_by_default

    def dense_chain(width, layers=2):
        x = keras.Input((width,))
        h = x
        for _ in range(layers):
            h = keras.layers.Dense(width)(h)
        return keras.Model(x, keras.layers.Activation("relu")(h))

    # Dense(W): a step's rows x (W + W) of inputs and output gradients against W x W + W of weight gradients.
    assert defer_by_default(dense_chain(64), rows=32)             # 32 x 128 <= 64 x 65
    assert not defer_by_default(dense_chain(64), rows=33)         # 33 x 128 > 4160
    assert not defer_by_default(keras.Sequential([keras.Input((3, 4)), keras.layers.Conv1D(2, 1)]), rows=1), \
        "nothing to defer"


def test_the_first_stage_fills_its_drain_with_a_weight_pass():
    # 1F1B's first stage: the earlier micro-batches' weight pass runs while the last backward's gradient is
    # awaited, the last micro-batch's after it; every backward is covered by exactly one weight pass.
    passes = with_weight_passes(one_f_one_b(8, 2, 0), 8, fill_drain=True)
    assert passes[-4:] == [(BACKWARD, 6), (WEIGHT, 6), (BACKWARD, 7), (WEIGHT, 7)]
    assert [p for p in passes if p.kind != WEIGHT] == one_f_one_b(8, 2, 0)
    assert max_live_micro_batches(passes) == 8
    # Nothing to fill when the previous weight pass already covered every earlier backward, or there is none.
    assert with_weight_passes(one_f_one_b(4, 2, 0), 1, fill_drain=True) == with_weight_passes(one_f_one_b(4, 2, 0), 1)
    assert with_weight_passes(one_f_one_b(1, 2, 0), 8, fill_drain=True) == [(FORWARD, 0), (BACKWARD, 0), (WEIGHT, 0)]
    # With K = 3 per weight pass: passes after b2 and b5, then the fill before b7 covers b6 alone.
    kinds = with_weight_passes(one_f_one_b(8, 2, 0), 3, fill_drain=True)
    assert [p for p in kinds if p.kind == WEIGHT] == [(WEIGHT, 2), (WEIGHT, 5), (WEIGHT, 6), (WEIGHT, 7)]


def test_one_f_one_b_runs_one_more_forward_ahead_when_weight_gradients_wait_for_the_step():
    # Only with one weight pass per step (the layer inputs of every micro-batch are held anyway), on every stage
    # but the last; the backwards keep their order.
    first = deferred_schedule("1f1b", 8, 2, 0, 8)
    assert first[:4] == [(FORWARD, 0), (FORWARD, 1), (FORWARD, 2), (BACKWARD, 0)]
    assert [p for p in first if p.kind != WEIGHT] == one_f_one_b(8, 2, 0, extra_warm_up=1)
    assert [m for k, m in first if k == BACKWARD] == list(range(8))
    assert deferred_schedule("1f1b", 8, 2, 1, 8) == with_weight_passes(one_f_one_b(8, 2, 1), 8)
    assert deferred_schedule("1f1b", 8, 3, 1, 8)[:4] == [(FORWARD, 0), (FORWARD, 1), (FORWARD, 2), (BACKWARD, 0)]
    assert [p for p in deferred_schedule("1f1b", 8, 2, 0, 3) if p.kind != WEIGHT] == one_f_one_b(8, 2, 0)
    assert one_f_one_b(2, 2, 0, extra_warm_up=1) == [(FORWARD, 0), (FORWARD, 1), (BACKWARD, 0), (BACKWARD, 1)]


def test_the_first_stage_places_its_weight_passes_where_it_would_wait():
    # GPipe's first stage: one weight pass after the first half of its backwards (their gradients keep
    # arriving meanwhile), one after the last; the other stages keep one weight pass per step.
    backwards = [(BACKWARD, m) for m in range(8)]
    assert deferred_schedule("gpipe", 8, 2, 0, 8) == (
        [(FORWARD, m) for m in range(8)] + backwards[:4] + [(WEIGHT, 3)] + backwards[4:] + [(WEIGHT, 7)])
    assert deferred_schedule("gpipe", 8, 2, 1, 8) == with_weight_passes(gpipe(8, 2, 1), 8)
    assert deferred_schedule("gpipe", 8, 3, 1, 8)[-2:] == [(BACKWARD, 7), (WEIGHT, 7)]
    assert [p for p in deferred_schedule("gpipe", 3, 2, 0, 3) if p.kind == WEIGHT] == [(WEIGHT, 1), (WEIGHT, 2)]
    assert [p for p in deferred_schedule("gpipe", 8, 2, 0, 2) if p.kind == WEIGHT] == [
        (WEIGHT, 1), (WEIGHT, 3), (WEIGHT, 5), (WEIGHT, 7)]       # already more often than that: as asked
    # 1F1B's first stage fills its drain; one stage alone has nobody to wait for.
    assert deferred_schedule("1f1b", 8, 2, 0, 8) == with_weight_passes(one_f_one_b(8, 2, 0, extra_warm_up=1), 8,
                                                                       fill_drain=True)
    assert deferred_schedule("1f1b", 8, 2, 1, 8) == with_weight_passes(one_f_one_b(8, 2, 1), 8)
    assert deferred_schedule("gpipe", 8, 1, 0, 8) == with_weight_passes(gpipe(8, 1, 0), 8)


def test_balanced_cut_minimises_the_slowest_stage():
    assert balance.balanced_cut([1, 1, 1, 1], 2) == [2]
    assert balance.balanced_cut([5, 1, 1, 1, 1, 1], 2) == [1]
    assert balance.balanced_cut([1, 2, 3, 4, 5, 6], 3, first_allowed=1) == [3, 5]
    assert balance.stages_from_cut(5, [2, 4]) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="cannot cut"):
        balance.balanced_cut([1, 1], 3)


def test_automatic_cut_of_a_plain_model_runs_like_the_model():
    keras.utils.set_random_seed(0)
    x = keras.Input((8,), name="x")
    h = x
    for i, width in enumerate([64, 8, 64, 8]):
        h = keras.layers.Dense(width, activation="relu", name=f"d{i}")(h)
    model = keras.Model(x, keras.layers.Dense(1, name="out")(h))
    graph = graph_of(model)
    costs = balance.measure_costs(model, graph, batch_size=4, repeats=1)
    assert len(costs) == len(graph.operations) and all(c >= 0 for c in costs)
    cuts = balance.balanced_cut(balance.parameter_costs(graph), 2, balance.earliest_cut(graph))
    plan = partition(model, graph, balance.stages_from_cut(len(graph.operations), cuts), 2)
    assert len(plan.edges) == 1
    data = np.random.default_rng(0).standard_normal((5, 8)).astype("float32")
    middle = plan.stages[0].model(data)
    np.testing.assert_allclose(np.asarray(plan.stages[1].model(middle)), np.asarray(model(data)), rtol=1e-6)


def test_measuring_an_automatic_cut_moves_no_state():
    """The automatic cut runs the layers to time them; BatchNormalization's moving statistics and a random
    layer's seed state must stay as built, or the pipeline would start training from other values than serial
    Keras's (they moved before)."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8,))
    h = keras.layers.Dropout(0.3, seed=2)(keras.layers.BatchNormalization()(keras.layers.Dense(16)(x)))
    model = keras.Model(x, keras.layers.GaussianNoise(0.1, seed=3)(keras.layers.Dense(2)(h)))
    before = [np.array(v.numpy()) for v in model.variables]
    assert len(balance.measure_costs(model, graph_of(model), batch_size=4, repeats=1)) == len(model.layers)
    for variable, value in zip(model.variables, before):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)
