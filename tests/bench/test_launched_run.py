"""bench/launched_run.py: a run's stdout lines reach the caller as they come (the sweep's per-step
progress), all output is still returned, and a run that outlives its timeout is killed with its group."""
import sys
import time

import pytest

from bench.launched_run import LaunchTimedOut, run_launched
from bench.sweep.progress import Progress


@pytest.mark.timeout(30)
def test_lines_arrive_while_the_run_goes_on():
    program = ("import sys, time\n"
               "print('TNT_BENCH_PROGRESS step 1/2 (timed) 0.10 s', flush=True)\n"
               "time.sleep(1.0)\n"
               "print('TNT_BENCH_PROGRESS step 2/2 (timed) 0.10 s', flush=True)\n"
               "print('to stderr', file=sys.stderr)\n")
    seen = []
    started = time.monotonic()
    done = run_launched([sys.executable, "-c", program], 20,
                        lambda line: seen.append((line, time.monotonic() - started)))
    assert done.returncode == 0 and done.stderr == "to stderr\n"
    assert done.stdout.count("TNT_BENCH_PROGRESS") == 2
    assert [line for line, _ in seen] == ["TNT_BENCH_PROGRESS step 1/2 (timed) 0.10 s",
                                          "TNT_BENCH_PROGRESS step 2/2 (timed) 0.10 s"]
    assert seen[1][1] - seen[0][1] > 0.5, seen  # the first line came before the program slept, not at its end


@pytest.mark.timeout(30)
def test_a_run_past_its_timeout_is_killed():
    started = time.monotonic()
    with pytest.raises(LaunchTimedOut):
        run_launched([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(60)"], 1.0)
    assert time.monotonic() - started < 10


def test_progress_prints_a_line_per_step(capsys):
    progress = Progress(1, "resnet50_small (tnt)")
    progress.step(2, "step 3/12 (timed) 0.45 s")
    assert capsys.readouterr().err == "tnt-bench:       2 device(s): step 3/12 (timed) 0.45 s\n"
