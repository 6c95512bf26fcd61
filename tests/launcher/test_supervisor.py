"""The supervisor without MPI: a fake job that reports a failure through an exit record."""
import sys
import time

import pytest

from tarantella.launcher.rank_wrapper import encode_exit_record
from tarantella.launcher.supervisor import failure_report, root_cause, run_job

FAILED = {"rank": 2, "size": 4, "local_rank": 0, "host": "node7", "pid": 99, "exit_code": 3,
          "signal": None, "cause": "failed", "command": ["python", "train.py"],
          "stderr_tail": "Traceback (most recent call last):\nValueError: bad batch\n",
          "stderr_shown": False}


def test_report_names_the_root_cause_first():
    stopped = dict(FAILED, rank=0, cause="stopped", exit_code=143, signal=15)
    later = dict(FAILED, rank=3, exit_code=1)
    report = failure_report(FAILED, [FAILED, stopped, later])
    first, *rest = report.splitlines()
    assert first == ("tarantella: error: rank 2 of 4 failed first: it exited with code 3 "
                     "on host node7: ValueError: bad batch")
    assert "    | ValueError: bad batch" in rest
    assert any("rank 3 (host node7) exited with code 1" in line for line in rest)
    assert any("1 rank(s) ended by the MPI or the launcher" in line for line in rest)


def test_the_first_line_names_the_last_exception_without_its_module():
    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "tarantella._engine.CollectiveTimeoutError: allreduce timed out after 5 s\n"
            "[rank 0] aborting\n")
    first = failure_report(dict(FAILED, stderr_tail=tail), []).splitlines()[0]
    assert first.endswith("on host node7: CollectiveTimeoutError: allreduce timed out after 5 s")
    assert failure_report(dict(FAILED, stderr_tail="just words\n"), []).splitlines()[0] \
        .endswith("on host node7")


def test_report_of_a_signal():
    killed = dict(FAILED, exit_code=137, signal=9, stderr_tail="")
    assert "was killed by SIGKILL (signal 9; exit code 137)" in failure_report(killed, [killed])


def _fake_job(record, then):
    """A command whose stderr carries a record, as mpirun's would, then does `then`."""
    line = encode_exit_record(record)
    code = (f"import sys, time; sys.stderr.write('partial line of rank 0 '); sys.stderr.flush(); "
            f"sys.stderr.buffer.write({line!r}); sys.stderr.write('continues\\n'); "
            f"sys.stderr.flush(); {then}")
    return [sys.executable, "-c", code]


@pytest.mark.timeout(30)
def test_exit_code_is_the_root_cause_and_other_output_passes(capfd):
    assert run_job(_fake_job(FAILED, "sys.exit(1)")) == 3
    err = capfd.readouterr().err
    assert "partial line of rank 0 \ntarantella: rank 2" in err  # the notice starts a line
    assert "\ncontinues\n" in err and "@@" not in err          # the record was taken out
    assert "tarantella: rank 2 (host node7) exited with code 3; stopping the job" in err
    assert "rank 2 of 4 failed first" in err


@pytest.mark.timeout(30)
def test_a_job_that_does_not_end_is_stopped_after_the_grace_period(capfd):
    start = time.monotonic()
    code = run_job(_fake_job(FAILED, "time.sleep(60)"), grace_seconds=1.0, kill_after_seconds=1.0)
    assert code == 3 and time.monotonic() - start < 10
    assert "the launcher stopped it" in capfd.readouterr().err


@pytest.mark.timeout(30)
def test_a_failure_without_a_record_keeps_the_job_exit_code(capfd):
    assert run_job([sys.executable, "-c", "import sys; sys.exit(5)"]) == 5
    assert "no rank reported a failure" in capfd.readouterr().err
    assert run_job([sys.executable, "-c", "pass"]) == 0


def test_root_cause_is_the_rank_that_ended_first_not_the_first_record():
    peer = dict(FAILED, rank=0, exit_code=14, end_time=100.2)
    killed = dict(FAILED, rank=1, exit_code=137, signal=9, end_time=100.0)
    stopped = dict(FAILED, rank=2, cause="stopped", end_time=99.0)
    assert root_cause([peer, killed, stopped]) is killed
    assert root_cause([stopped]) is None
