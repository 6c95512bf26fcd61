"""A rank alone in its world while the launcher or srun started N: it stops, naming why."""
import os
import subprocess
import sys

import pytest

from tarantella.world_check import WorldSizeError, announced_size, check_world_size
from tests.multirank import REPO_ROOT


def test_who_announces_the_size():
    assert announced_size({}) is None
    assert announced_size({"SLURM_STEP_NUM_TASKS": "4"})[:2] == (4, "SLURM_STEP_NUM_TASKS")
    # under mpirun in an allocation, srun started the daemons (a step of one task per
    # node): mpirun's own size wins
    assert announced_size({"SLURM_STEP_NUM_TASKS": "1", "OMPI_COMM_WORLD_SIZE": "4"})[0] == 4
    assert announced_size({"TNT_WORLD_SIZE": "2", "PMI_SIZE": "3"})[:2] == (2, "TNT_WORLD_SIZE")


def test_matching_sizes_pass_and_others_raise_naming_the_cause():
    check_world_size(2, {"TNT_WORLD_SIZE": "2"})
    check_world_size(1, {})
    with pytest.raises(WorldSizeError, match=r"alone in its MPI world, but srun started 2 ranks "
                                             r"\(SLURM_STEP_NUM_TASKS=2\).*srun --mpi=pmix"):
        check_world_size(1, {"SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "7"})
    with pytest.raises(WorldSizeError, match="world has 2 ranks, but Open MPI's mpirun started 4"):
        check_world_size(2, {"OMPI_COMM_WORLD_SIZE": "4"})


@pytest.mark.timeout(60)
def test_a_singleton_told_it_has_peers_stops_at_init():
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "9"}
    for name in ("TNT_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", "import tarantella as tnt; tnt.get_rank()"],
                          capture_output=True, text=True, timeout=50, env=env)
    assert done.returncode == 1
    assert "WorldSizeError: this rank is alone in its MPI world, but srun started 2" in done.stderr
