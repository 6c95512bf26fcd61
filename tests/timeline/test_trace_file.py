"""One-process checks of the timeline's files and the overlap measure (no MPI needed)."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tarantella.timeline.overlap import overlap_from_trace, overlap_summary, step_overlap
from tarantella.timeline import names, trace_file
from tarantella.timeline.recorder import Recorder
from tarantella.timeline.session import merge_rank_files, rank_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_step_overlap_counts_busy_time_before_the_last_gradient():
    # backward ends at 10: [2, 5] fully hidden, [8, 12] half, [10, 11] exposed but inside [8, 12]:
    # busy time is the union of the spans, [2, 5] and [8, 12]
    row = step_overlap([(2.0, 5.0), (8.0, 12.0), (10.0, 11.0)], backward_end=10.0)
    assert row["communication_s"] == pytest.approx(7.0)
    assert row["hidden_s"] == pytest.approx(5.0)
    assert row["overlap_share"] == pytest.approx(5.0 / 7.0)
    assert row["exposed_s"] == pytest.approx(2.0)
    chained = step_overlap([(1.0, 4.0), (3.0, 6.0), (5.0, 9.0)], backward_end=6.0)  # overlapping spans
    assert chained["communication_s"] == pytest.approx(8.0) and chained["hidden_s"] == pytest.approx(5.0)
    after = step_overlap([(10.5, 11.0), (11.0, 13.0)], backward_end=10.0)  # the no-overlap mode
    assert after["overlap_share"] == 0.0 and after["exposed_s"] == pytest.approx(3.0)
    assert step_overlap([], backward_end=1.0)["overlap_share"] == 0.0


def _two_rank_trace():
    ranks = []
    for rank, shift in ((0, 0.0), (1, 0.001)):
        recorder = Recorder()
        for step in range(3):
            base = 100.0 + step + shift
            recorder.complete(names.STEP, "step", base, base + 0.5, step=step)
            recorder.complete(names.BACKWARD, "step", base + 0.1, base + 0.3, step=step, gradients=4)
            recorder.complete(names.ALLREDUCE, "reducer", base + 0.2, base + 0.4, step=step, bucket=0, bytes=64)
            recorder.complete(names.ALLREDUCE, "reducer", base + 0.4, base + 0.45, step=step, bucket=1, bytes=32)
        ranks.append(trace_file.rank_trace(rank, recorder.events, recorder.wall_offset))
    return trace_file.merge_traces(ranks)


def test_merged_trace_has_a_process_per_rank_and_a_thread_per_track(tmp_path):
    trace = _two_rank_trace()
    path = str(tmp_path / "t.json")
    trace_file.write_trace(path, trace)
    loaded = json.load(open(path))
    meta = {(e["pid"], e["name"], e["args"].get("name")) for e in loaded["traceEvents"] if e["ph"] == "M"}
    assert (0, "process_name", "rank 0") in meta and (1, "process_name", "rank 1") in meta
    assert (1, "thread_name", "reducer") in meta and (0, "thread_name", "step") in meta
    assert min(e["ts"] for e in loaded["traceEvents"] if e["ph"] == "X") == pytest.approx(0.0, abs=5e4)
    rows = overlap_from_trace(path)
    assert len(rows) == 6
    for row in rows:  # 0.1 of 0.25 s busy lies before backward's end
        assert row["overlap_share"] == pytest.approx(0.1 / 0.25, rel=1e-3)
        assert row["exposed_s"] == pytest.approx(0.15, rel=1e-3)
    summary = overlap_summary(rows, skip_steps=1)
    assert summary["steps"] == 2 and summary["ranks"] == 2


def test_buckets_of_metric_state_alone_are_left_out_of_the_overlap():
    recorder = Recorder()
    recorder.complete(names.BACKWARD, "step", 10.0, 20.0, step=0, gradients=2)
    recorder.complete(names.ALLREDUCE, "reducer", 11.0, 19.0, step=0, bucket=0, bytes=8, metrics_only=True)
    recorder.complete(names.ALLREDUCE, "reducer", 18.0, 22.0, step=0, bucket=1, bytes=64)
    (row,) = overlap_from_trace(trace_file.merge_traces([trace_file.rank_trace(0, recorder.events, 0.0)]))
    assert row["buckets"] == 1 and row["overlap_share"] == pytest.approx(0.5) and row["exposed_s"] == pytest.approx(2.0)


def test_rank_files_merge_on_one_time_axis(tmp_path):
    target = str(tmp_path / "job.json")
    for rank, start in ((0, 5.0), (1, 5.25)):
        recorder = Recorder()
        recorder.complete(names.STEP, "step", start, start + 1.0, step=0)
        trace_file.write_trace(rank_file(target, rank),
                               trace_file.merge_traces([trace_file.rank_trace(rank, recorder.events,
                                                                              recorder.wall_offset)]))
    assert merge_rank_files(target) == (target, 2)
    steps = {e["pid"]: e["ts"] for e in trace_file.spans(trace_file.read_trace(target), names.STEP)}
    assert steps[1] - steps[0] == pytest.approx(0.25e6, abs=1.0)
    with pytest.raises(FileNotFoundError, match="no per-rank timeline files"):
        merge_rank_files(str(tmp_path / "other.json"))


PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    from tarantella import timeline
    from tarantella.timeline import session
    # As in a foreground job: a test run in the background (`cmd &` in a script) inherits SIGINT
    # ignored, and Python then keeps it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    session.start(sys.argv[1], rank=1, size=2)
    for step in range(50):
        with timeline.span("work", track="python", step=step):
            pass
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(30)
""")


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stopped_rank_leaves_a_complete_loadable_file(tmp_path, signal_name):
    target = str(tmp_path / "stopped.json")
    result = subprocess.run([sys.executable, "-c", PROGRAM, target, signal_name], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode != 0
    assert not os.path.exists(target)  # no collective merge after a stop
    spans = trace_file.spans(trace_file.read_trace(rank_file(target, 1)), "work")
    assert sorted(e["args"]["step"] for e in spans) == list(range(50))
    assert {e["pid"] for e in spans} == {1}
