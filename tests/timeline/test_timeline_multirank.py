"""The timeline of a 2-rank tnt.Model fit, through the launcher's --timeline flag: one merged,
loadable trace with each rank's tracks and the documented spans; the overlap measure from it."""
import json
import os
import re

import pytest

from tarantella.timeline.overlap import overlap_from_trace
from tarantella.timeline import names, trace_file
from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "train_with_timeline.py")
STEPS = 4


@pytest.mark.multirank
@pytest.mark.timeout(270)
@pytest.mark.parametrize("mode", ["overlap", "no_overlap", "sharded", "sharded_weights",
                                  *(pytest.param(mode, marks=pytest.mark.extended)   # tests/conftest.py's tiers
                                    for mode in ("sharded_gradients", "sharded_gradients_no_overlap"))])
def test_two_rank_fit_writes_one_merged_trace(tmp_path, mode):
    target = tmp_path / "trace.json"
    result = run_ranks(2, PROGRAM, args=[mode], timeout=240, launcher_args=["--timeline", str(target)]).check()
    assert not list(tmp_path.glob("trace.json.rank*")), "per-rank files are removed after a clean merge"
    with open(target) as handle:
        trace = json.load(handle)  # loadable JSON
    bucket_bytes = json.loads(re.search(r"\bBUCKETS (\[.*\])", result.stdout).group(1))
    gradient_buckets = set(json.loads(re.search(r"GRADIENT_BUCKETS (\[.*\])", result.stdout).group(1)))
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    thread_names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    to_owners_mode = mode.startswith("sharded_gradients") or mode == "sharded_weights"
    gathers_mode = mode == "sharded_weights"
    tracks = ("step", "metrics", "statistics") + (() if to_owners_mode else ("reducer",))
    assert {(r, t) for r in (0, 1) for t in tracks} <= thread_names
    for rank in (0, 1):
        mine = [e for e in trace_file.spans(trace) if e["pid"] == rank]
        for name in (names.STEP, names.BACKWARD, names.OPTIMIZER):
            assert sorted(e["args"]["step"] for e in mine if e["name"] == name) == list(range(STEPS)), name
        for step in range(STEPS):
            allreduces = [e for e in mine if e["name"] == names.ALLREDUCE and e["args"]["step"] == step]
            assert sorted(e["args"]["bucket"] for e in allreduces) == list(range(len(bucket_bytes)))
            assert sum(e["args"]["bytes"] for e in allreduces) == sum(bucket_bytes)
            step_span = next(e for e in mine if e["name"] == names.STEP and e["args"]["step"] == step)
            backward = next(e for e in mine if e["name"] == names.BACKWARD and e["args"]["step"] == step)
            update = next(e for e in mine if e["name"] == names.OPTIMIZER and e["args"]["step"] == step)
            inside = lambda e: step_span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step_span["ts"] + step_span["dur"]
            assert inside(backward) and inside(update) and all(inside(e) for e in allreduces)
            # the update needs the reduced gradients (sharded: only those of the variables this rank owns, so a
            # bucket of others' gradients may finish after its update); every bucket's reduction needs its gradients
            if gradient_buckets:
                if mode == "overlap" or mode == "no_overlap":
                    assert update["ts"] + update["dur"] >= max(e["ts"] + e["dur"] for e in allreduces
                                                               if e["args"]["bucket"] in gradient_buckets)
                assert min(e["ts"] for e in allreduces if e["args"]["bucket"] in gradient_buckets) >= backward["ts"]
            assert any(e["name"] == names.METRIC_ALLREDUCE and e["args"]["step"] == step for e in mine)
            statistics = [e for e in mine if e["name"] == names.STATISTICS_ALLREDUCE and e["args"]["step"] == step]
            # forward, backward; with shard="weights" the forward recomputed for the backward pass computes the same
            # statistics from the same input, which the graph optimiser takes from the forward pass (observed: 2)
            assert len(statistics) == 2 and all(inside(e) for e in statistics), statistics
            assert sorted(e["args"]["index"] for e in statistics) == [0, 1]
            assert statistics[0]["ts"] + statistics[0]["dur"] <= backward["ts"] + backward["dur"]
            handoffs = [e for e in mine if e["name"] == names.WEIGHT_HANDOFF and e["args"]["step"] == step]
            to_owners = [e for e in mine if e["name"] == names.GRADIENTS_TO_OWNERS and e["args"]["step"] == step]
            if to_owners_mode:  # each rank sends what it does not own, receives for what it owns
                assert len(to_owners) == 1 and inside(to_owners[0])
                # shard="weights": a layer's backward pass needs its activations, not the loss's mark, so the last
                # layers' gradients may leave before the `backward` span (which starts at that mark) begins
                assert gathers_mode or to_owners[0]["ts"] >= backward["ts"]
                assert to_owners[0]["args"]["transfers"] == 8, to_owners
                if mode.endswith("no_overlap"):  # no gradient leaves before the last one exists
                    assert to_owners[0]["ts"] >= backward["ts"] + backward["dur"], (to_owners, backward)
            else:
                assert not to_owners
            gathers = [e for e in mine if e["name"] == names.WEIGHT_GATHERS and e["args"]["step"] == step]
            if gathers_mode:  # per variable, forward and backward: sent by its owner, received by the other rank
                assert len(gathers) == 1 and inside(gathers[0]) and gathers[0]["args"]["transfers"] == 16, gathers
                assert gathers[0]["ts"] < backward["ts"] + backward["dur"], (gathers, backward)
                assert not handoffs
            elif mode.startswith("sharded"):  # each rank sends what it owns and receives the rest: one per variable
                assert len(handoffs) == 1 and inside(handoffs[0]) and handoffs[0]["ts"] >= update["ts"], handoffs
                assert handoffs[0]["args"]["transfers"] == 8, handoffs  # 3 Dense + BatchNormalization: 8 variables
            else:
                assert not handoffs
    rows = overlap_from_trace(str(target))
    if to_owners_mode:  # no gradient allreduce: nothing overlaps backprop by that measure
        return
    assert {(row["rank"], row["step"]) for row in rows} == {(r, s) for r in (0, 1) for s in range(STEPS)}
    if mode == "no_overlap":  # no allreduce starts before the last gradient exists
        shares = [(row["rank"], row["step"], round(row["overlap_share"], 3), round(row["exposed_s"], 6)) for row in rows]
        assert all(row["overlap_share"] < 0.01 and row["exposed_s"] > 0 for row in rows), shares


TWO_BRANCH = os.path.join(os.path.dirname(__file__), "programs", "two_branch_starts.py")


@pytest.mark.multirank
@pytest.mark.timeout(270)
def test_starts_follow_backprop_not_registration_order(tmp_path):
    """One bucket per tensor (--fusion-threshold 0). Registration order is the reverse of the variables:
    out, deep3 .. deep0, shallow (a subclassed model: variables in attribute order). Backprop produces the shallow layer's gradients right after out's, long
    before deep0's (four 2048-wide layers later): its bucket must be handed over (bucket_ready) first, and once
    the ranks agreed on the order they saw (after the second step), also be reduced first. Two inter-op threads:
    with one (the launcher's default for a rank with one CPU) TensorFlow runs the two branches' backward one after
    the other, deep first (Note [Thread defaults] in tarantella/launcher/rank_wrapper.py), and backprop itself
    produces shallow's gradient last."""
    target = tmp_path / "trace.json"
    result = run_ranks(2, TWO_BRANCH, timeout=240,
                       launcher_args=["--timeline", str(target), "--fusion-threshold", "0",
                                      "-x", "TF_NUM_INTEROP_THREADS=2"]).check()
    assert "GRAPH OK" in result.stdout
    variables = json.loads(re.search(r"VARIABLES (\[.*\])", result.stdout).group(1))
    registered = variables[::-1]
    shallow, deep0 = (next(i for i, name in enumerate(registered) if name.endswith(f"{layer}/kernel"))
                      for layer in ("shallow", "deep0"))
    assert shallow > deep0, registered  # registered after deep0, produced long before it
    trace = trace_file.read_trace(str(target))
    ready = {(e["pid"], e["args"]["step"], e["args"]["bucket"]): e["ts"] for e in trace["traceEvents"]
             if e["name"] == names.BUCKET_READY}
    steps = sorted({step for _, step, _ in ready})
    assert len(steps) == 5
    # Chained starts hand shallow's bucket over after deep0's in every step, whatever the timing. Unchained, it
    # goes first unless the machine's load holds its op back: at least one step after the first must show it.
    for rank in (0, 1):
        early = [step for step in steps[1:] if ready[(rank, step, shallow)] < ready[(rank, step, deep0)]]
        assert early, f"rank {rank}: shallow's start waited for deep0's in every step"
    # Finishes are not chained behind the last start either (Note [Start and finish ops are not chained]): the
    # first reduced gradient can reach the optimizer (optimizer_update begins) while backprop still runs. Chained,
    # every finish ran after the last start, so after the last gradient, in every step.
    for rank in (0, 1):
        mine = [e for e in trace_file.spans(trace) if e["pid"] == rank]
        backward_end = {e["args"]["step"]: e["ts"] + e["dur"] for e in mine if e["name"] == names.BACKWARD}
        update_begin = {e["args"]["step"]: e["ts"] for e in mine if e["name"] == names.OPTIMIZER}
        during = [step for step in steps[1:] if update_begin[step] < backward_end[step]]
        assert during, f"rank {rank}: the first reduced gradient came after backprop in every step"
    # The loss tracker's state rides in buckets of its own (threshold 0): marked, and left out of the overlap.
    metric_only = {e["args"]["bucket"] for e in trace_file.spans(trace, names.ALLREDUCE) if e["args"].get("metrics_only")}
    assert metric_only == set(range(len(variables), len(variables) + len(metric_only))) and metric_only, metric_only
    # ... handed over once every gradient exists (Note [Metric state rides with the gradients]), not right after
    # the forward pass, ahead of every gradient: later than most gradient buckets in every step. (The last
    # gradients' starts may still be copying when the state's start runs: not later than all.)
    gradient_buckets = range(len(variables))
    for rank in (0, 1):
        for step in steps:
            middle = sorted(ready[(rank, step, b)] for b in gradient_buckets)[len(variables) // 2]
            early_state = [b for b in metric_only if ready[(rank, step, b)] < middle]
            assert not early_state, f"rank {rank} step {step}: metric state handed over before most gradients"
    assert {row["buckets"] for row in overlap_from_trace(trace)} == {len(variables)}
    # Note [Buckets are reduced in an agreed order]: from the third step on, every rank reduces its buckets
    # in the order rank 0 queued them in the second step. (The trace's times resolve about 0.2 us, absolute
    # wall-clock seconds in doubles: buckets taken or queued closer than that may tie, and then any order fits.)
    buckets = sorted({bucket for _, _, bucket in ready})
    queued_first = [(a, b) for a in buckets for b in buckets if ready[(0, steps[1], a)] < ready[(0, steps[1], b)]]
    started = {(e["pid"], e["args"]["step"], e["args"]["bucket"]): e["ts"] for e in trace_file.spans(trace, names.ALLREDUCE)}
    for rank in (0, 1):
        for step in steps[:2]:  # before the agreement: registration (id) order
            assert all(started[(rank, step, a)] <= started[(rank, step, a + 1)] for a in buckets[:-1]), (rank, step)
        for step in steps[2:]:
            wrong = [(a, b) for a, b in queued_first if started[(rank, step, a)] > started[(rank, step, b)]]
            assert not wrong, f"rank {rank} step {step}: reduced against rank 0's order of step {steps[1]}: {wrong}"
