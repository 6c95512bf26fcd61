"""`python -m tarantella.timeline render`: a picture of one step of a small two-rank trace (no MPI needed)."""
import os
import subprocess
import sys

import pytest

from tarantella.timeline import names, trace_file
from tarantella.timeline.recorder import Recorder
from tarantella.timeline.render import RenderError, render_step, step_window

pytest.importorskip("matplotlib", reason="rendering needs matplotlib (pip install matplotlib / tarantella[bench])")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _trace(steps=3, ranks=2):
    recorded = []
    for rank in range(ranks):
        recorder = Recorder()
        for step in range(steps if rank == 0 else steps - 1):  # rank 1 misses the last step
            base = 50.0 + step
            recorder.complete(names.STEP, "step", base, base + 0.5, step=step)
            recorder.complete(names.BACKWARD, "step", base + 0.05, base + 0.3, step=step, gradients=4)
            recorder.complete(names.OPTIMIZER, "step", base + 0.3, base + 0.45, step=step)
            for bucket, (start, end) in enumerate(((0.2, 0.28), (0.3, 0.4))):
                recorder.instant(names.BUCKET_READY, "reducer", base + start - 0.01, step=step, bucket=bucket)
                recorder.complete(names.ALLREDUCE, "reducer", base + start, base + end, step=step, bucket=bucket,
                                  bytes=1024)
            recorder.complete(names.METRIC_ALLREDUCE, "metrics", base + 0.46, base + 0.47, step=step, bucket=0,
                              bytes=8)
        recorded.append(trace_file.rank_trace(rank, recorder.events, recorder.wall_offset))
    return trace_file.merge_traces(recorded)


def test_the_default_step_is_the_last_every_rank_recorded():
    trace = _trace()
    step, begin, end = step_window(trace)
    assert step == 1
    assert end - begin == pytest.approx(0.5e6, abs=5e3)  # the ranks' recorders differ in wall offset by microseconds
    assert step_window(trace, 2)[0] == 2
    with pytest.raises(RenderError, match="no step 7; it has steps 0..2"):
        step_window(trace, 7)
    with pytest.raises(RenderError, match="no `train_step` spans"):
        step_window({"traceEvents": []})


def test_render_writes_a_png_of_the_step(tmp_path):
    trace = _trace()
    source = str(tmp_path / "trace.json")
    trace_file.write_trace(source, trace)
    target = str(tmp_path / "step.png")
    assert render_step(source, target) == 1
    with open(target, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE
    assert os.path.getsize(target) > 10_000  # six labelled rows of bars, not an empty canvas

    picture = str(tmp_path / "cli.png")
    done = subprocess.run([sys.executable, "-m", "tarantella.timeline", "render", source, picture, "--step", "0"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "step 0 of" in done.stdout and open(picture, "rb").read(8) == PNG_SIGNATURE
    missing = subprocess.run([sys.executable, "-m", "tarantella.timeline", "render", source, picture, "--step", "9"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert missing.returncode == 1 and "no step 9" in missing.stderr
