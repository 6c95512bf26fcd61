"""The timeline of a 2-rank tnt.Model fit, through the launcher's --timeline flag: one merged,
loadable trace with each rank's tracks and the documented spans; the overlap measure from it."""
import json
import os
import re

import pytest

from tarantella.keras.overlap import overlap_from_trace
from tarantella.timeline import names, trace_file
from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "train_with_timeline.py")
STEPS = 4


@pytest.mark.parametrize("mode", ["overlap", "no_overlap"])
def test_two_rank_fit_writes_one_merged_trace(tmp_path, mode):
    target = tmp_path / "trace.json"
    result = run_ranks(2, PROGRAM, args=[mode], timeout=240, launcher_args=["--timeline", str(target)]).check()
    assert not list(tmp_path.glob("trace.json.rank*")), "per-rank files are removed after a clean merge"
    with open(target) as handle:
        trace = json.load(handle)  # loadable JSON
    bucket_bytes = json.loads(re.search(r"BUCKETS (\[.*\])", result.stdout).group(1))
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    thread_names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(r, t) for r in (0, 1) for t in ("step", "reducer", "metrics")} <= thread_names
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
            # the update needs the reduced gradients; every bucket's reduction needs its gradients
            assert update["ts"] + update["dur"] >= max(e["ts"] + e["dur"] for e in allreduces)
            assert min(e["ts"] for e in allreduces) >= backward["ts"]
            assert any(e["name"] == names.METRIC_ALLREDUCE and e["args"]["step"] == step for e in mine)
    rows = overlap_from_trace(str(target))
    assert {(row["rank"], row["step"]) for row in rows} == {(r, s) for r in (0, 1) for s in range(STEPS)}
    if mode == "no_overlap":  # no allreduce starts before the last gradient exists
        assert all(row["overlap_share"] == 0.0 and row["exposed_s"] > 0 for row in rows)
