"""Real jobs through the launcher and Open MPI: output, environment, failures.

Written for any rank count (expected values come from n); run at 1, 2 and 3 ranks,
3 being more ranks than this machine may have cores (--oversubscribe)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tarantella.config import SETTINGS
from tarantella.launcher.rank_wrapper import interop_threads
from tests.multirank import RANK_HELPERS, REPO_ROOT, RanksTimedOut, run_ranks, split_by_rank

SIZES = (1, 2, 3)
START_UP = 10.0  # seconds we allow Open MPI and the interpreters to start, on a busy machine

REPORT = RANK_HELPERS + """
import os, sys
rank, size = rank_of_env(), size_of_env()
print(f"rank {rank} size {size}")
print(f"threads {os.environ['OMP_NUM_THREADS']} {os.environ['TF_NUM_INTRAOP_THREADS']} "
      f"{os.environ['TF_NUM_INTEROP_THREADS']}")
print("env", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("TNT_")))
print(f"x {os.environ.get('FOO')}")
print(f"to stderr from {rank}", file=sys.stderr)
"""


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", SIZES)
def test_every_rank_runs_with_its_environment(n):
    result = run_ranks(n, REPORT, launcher_args=["-x", "FOO=bar baz", "--fusion-threshold", "64"],
                       timeout=45).check()
    assert sorted(result.rank_stdout) == list(range(n))
    expected_env = {s.env: ("1" if s.env == "TNT_OUTPUT_ON_ALL_DEVICES" else
                            "64" if s.env == "TNT_FUSION_THRESHOLD_KB" else
                            ("0" if s.default is False else str(s.default))) for s in SETTINGS}
    expected_env["TNT_LAUNCHED"] = "1"
    expected_env["TNT_WORLD_SIZE"] = str(n)
    threads = max(1, _cpus() // n)
    for rank in range(n):
        lines = result.rank_stdout[rank].splitlines()
        assert lines[0] == f"rank {rank} size {n}"
        assert lines[1] == f"threads {threads} {threads} {interop_threads(threads)}"
        env = dict(pair.split("=", 1) for pair in lines[2].split()[1:])
        assert env == expected_env
        assert lines[3] == "x bar baz"
        assert result.rank_stderr[rank] == f"to stderr from {rank}\n"


@pytest.mark.timeout(60)
def test_only_the_master_is_heard_by_default():
    n = 3
    result = run_ranks(n, REPORT, all_output=False, timeout=45).check()
    assert result.stdout.splitlines()[0] == "rank 0 size 3"   # untagged
    assert "rank 1" not in result.stdout and "rank 2" not in result.stdout
    assert result.stderr == "to stderr from 0\n"


@pytest.mark.timeout(60)
def test_log_on_all_devices_shows_every_stderr_tagged():
    n = 2
    result = run_ranks(n, REPORT, all_output=False, launcher_args=["--log-on-all-devices"],
                       timeout=45).check()
    assert result.rank_stderr == {rank: f"to stderr from {rank}\n" for rank in range(n)}
    assert sorted(result.rank_stdout) == [0]  # stdout: the master only, tagged


@pytest.mark.timeout(60)
def test_user_thread_counts_are_kept():
    result = run_ranks(2, REPORT, launcher_args=["-x", "OMP_NUM_THREADS=5"],
                       env={"TF_NUM_INTEROP_THREADS": "3", "TF_NUM_INTRAOP_THREADS": None},
                       timeout=45).check()
    threads = max(1, _cpus() // 2)
    for rank in range(2):
        assert result.rank_stdout[rank].splitlines()[1] == f"threads 5 {threads} 3"


@pytest.mark.timeout(60)
def test_a_binary_runs_on_every_rank():
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "-n", "2",
                           "--output-on-all-devices", "--python-interpreter=", "--",
                           "/bin/echo", "hello"], capture_output=True, text=True, timeout=45,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0] hello", "[1] hello"]


@pytest.mark.timeout(60)
def test_a_hostfile_gives_the_rank_count(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# this machine, more slots than it may have cores\nlocalhost slots=3\n")
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "--hostfile", str(hosts),
                           "--output-on-all-devices", "--", "-c",
                           RANK_HELPERS + "print(rank_of_env(), size_of_env())"],
                          capture_output=True, text=True, timeout=45,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[{r}] {r} 3" for r in range(3)]


FAIL_LAST = RANK_HELPERS + """
import sys, time
rank, size = rank_of_env(), size_of_env()
if rank == size - 1:
    print(f"rank {rank} gives up", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", SIZES)
def test_a_failing_rank_ends_the_job_with_its_exit_code(n):
    failing = n - 1
    result = run_ranks(n, FAIL_LAST, all_output=False, timeout=45)
    assert result.returncode == 3, result.describe()
    assert result.elapsed < 10 + START_UP, result.describe()
    report = result.stderr[result.stderr.index("tarantella: error: "):]
    first = report.splitlines()[0]
    assert first.startswith(f"tarantella: error: rank {failing} of {n} failed first: "
                            f"it exited with code 3 on host "), report
    assert f"    | rank {failing} gives up" in report


KILL_ONE = RANK_HELPERS + """
import os, signal, time
rank, size = rank_of_env(), size_of_env()
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal():
    result = run_ranks(2, KILL_ONE, all_output=False, timeout=45)
    assert result.returncode == 128 + 9, result.describe()
    assert result.elapsed < 10 + START_UP
    assert "rank 1 of 2 failed first: it was killed by SIGKILL (signal 9; exit code 137)" \
        in result.stderr, result.describe()


def _processes_running(path: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                words = handle.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if path in words:
            found.append(pid)
    return found


def test_the_runner_credits_a_line_glued_to_open_mpis_banner_to_its_rank():
    output = "[1] one\n" + "-" * 74 + "[0] tarantella: in pipeline stage 0 of 2: injected failure\nnot [2] tagged\n"
    assert split_by_rank(output) == {0: "tarantella: in pipeline stage 0 of 2: injected failure\n", 1: "one\n"}


@pytest.mark.timeout(30)
def test_the_runner_kills_a_job_that_outlives_its_timeout(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text("import time; print('started', flush=True); time.sleep(60)\n")
    with pytest.raises(RanksTimedOut, match="did not finish within 3"):
        run_ranks(2, script, timeout=3)
    # mpirun was killed with SIGKILL: each wrapper notices and stops its program
    deadline = time.monotonic() + 10
    while _processes_running(str(script)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_running(str(script)) == []
