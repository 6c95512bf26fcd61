"""tarantella under a real (one-node) Slurm: sbatch and salloc jobs form one world,
keep their settings without --export, end when a rank fails; and srun without the
launcher is stopped, not run as N copies (tests/cluster/slurm_fixture.py starts and
stops the daemons). Training under Slurm, on two nodes: test_slurm_hosts.py."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time

import numpy as np
import pytest

from tests.cluster.slurm_fixture import slurm  # noqa: F401  (the fixture)
from tests.cluster.results import rank_results
from tests.multirank import REPO_ROOT, run_ranks

PROGRAM = os.path.join(REPO_ROOT, "tests", "cluster", "programs", "multi_host_step.py")
LAUNCHER = [sys.executable, "-m", "tarantella.launcher"]
# --export=NONE: the job starts with Slurm's variables only, so the launcher's
# settings must travel with mpirun (-x), not with srun's environment.
JOB_ENV = f"cd {shlex.quote(REPO_ROOT)} && export PYTHONPATH={shlex.quote(REPO_ROOT)} " \
          f"TF_CPP_MIN_LOG_LEVEL=2 &&"


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_sbatch_job_forms_one_world_and_keeps_its_settings(slurm, tmp_path):
    """The layout only: a training step under Slurm runs in tests/cluster/test_slurm_hosts.py
    (two nodes), which this one node would only repeat."""
    out = tmp_path / "job.out"
    command = shlex.join([*LAUNCHER, "--timeout", "123", "--output-on-all-devices", "--",
                          PROGRAM, "layout-only"])
    done = slurm.batch(["-n", "2", "-c", "1", "--export=NONE", "-o", str(out),
                        "--wrap", f"{JOB_ENV} {command}"], timeout=180)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + text
    found = rank_results(text)
    assert sorted(found) == [0, 1], text
    for values in found.values():
        assert values["size"] == 2 and values["allreduce_ok"]
        assert values["omp_threads"] == "1"          # sbatch -c 1
        assert values["timeout_seconds"] == 123.0    # the flag, without --export


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_salloc_runs_the_launcher_on_the_allocation(slurm):
    done = slurm.run(["salloc", "-n", "2", *LAUNCHER, "--output-on-all-devices", "--",
                      PROGRAM, "layout-only"], timeout=100, cwd=REPO_ROOT,
                     env={"PYTHONPATH": REPO_ROOT})
    assert done.returncode == 0, done.stdout + done.stderr
    found = rank_results(done.stdout)
    assert sorted(found) == [0, 1] and all(v["size"] == 2 for v in found.values()), done.stdout


# Rank 1 says where it runs and exits with 3; the others would wait for 2 minutes.
FAIL_RANK_1 = ("import socket, sys, time, tarantella as tnt\n"
               "if tnt.get_rank() == 1:\n"
               "    print(f'rank 1 gives up on {socket.gethostname()}', file=sys.stderr,\n"
               "          flush=True)\n"
               "    sys.exit(3)\n"
               "time.sleep(120)\n")


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_failing_rank_ends_the_sbatch_job(slurm, tmp_path):
    script, out = tmp_path / "fail.py", tmp_path / "job.out"
    script.write_text(FAIL_RANK_1)
    start = time.monotonic()
    done = slurm.batch(["-n", "2", "-o", str(out), "--wrap",
                        f"{JOB_ENV} {shlex.join([*LAUNCHER, '--', str(script)])}"], timeout=100)
    text = out.read_text()
    assert done.returncode == 3, done.stderr + text        # the job's exit code: rank 1's
    assert time.monotonic() - start < 60, text
    assert "tarantella: error: rank 1 of 2 failed first: it exited with code 3 on host " in text
    assert "rank 1 gives up" in text


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_srun_without_the_launcher_stops_instead_of_training_copies(slurm, tmp_path):
    """srun gives Open MPI 5 no PMIx here: each task would be rank 0 of 1."""
    out = tmp_path / "job.out"
    program = "import tarantella as tnt; print('size', tnt.get_size(), flush=True)"
    srun = shlex.join(["srun", "-n", "2", sys.executable, "-c", program])
    done = slurm.batch(["-n", "2", "-o", str(out), "--wrap", f"{JOB_ENV} {srun}"],
                       timeout=100)
    text = out.read_text()
    assert done.returncode != 0, text
    assert "size 1" not in text
    assert text.count("WorldSizeError: this rank is alone in its MPI world, but srun started "
                      "2 ranks (SLURM_STEP_NUM_TASKS=2)") == 2, text


@pytest.mark.multirank
@pytest.mark.extended   # under Slurm on two nodes: tests/cluster/test_slurm_hosts.py (tests/conftest.py: the tiers)
@pytest.mark.timeout(200)
def test_an_elastic_sbatch_job_goes_on_without_a_killed_rank(slurm, tmp_path):
    """`tarantella --elastic` in an sbatch job: its generations run inside the allocation; a rank killed
    (SIGKILL) leaves its slot, and the job ends with the weights of an uninterrupted 1-rank run within float
    rounding (the elastic tests compare bit for bit on this host: tests/elastic)."""
    program = os.path.join(REPO_ROOT, "tests", "elastic", "programs", "elastic_fit.py")
    out = tmp_path / "job.out"
    command = shlex.join([*LAUNCHER, "--elastic", "--min-ranks", "1", "--output-on-all-devices", "--",
                          program, "--fault", "1:1:6:kill"])
    done = slurm.batch(["-n", "2", "-c", "1", "--export=NONE", "-o", str(out),
                        "--wrap", f"{JOB_ENV} {command}"], timeout=180)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + text
    assert re.search(r"tarantella: elastic: lost rank 1 \(host \S+\) was killed by SIGKILL .*; generation 2 goes "
                     r"on with 1 rank\(s\)", text), text
    [result] = [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]
    assert result["generation"] == 2 and result["size"] == 1 and result["steps"] == 24, text
    reference = run_ranks(1, program, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120).check()
    [expected] = [json.loads(line.split("RESULT ", 1)[1]) for line in reference.stdout.splitlines()
                  if "RESULT " in line]
    for mine, theirs in zip(result["weights"], expected["weights"]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
