"""Mismatches and lost ranks give errors on every rank, never hangs."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_failures.py")
CHECKS = ["count mismatch via shared_memory", "count mismatch via ring", "count mismatch via recursive_doubling",
          "count mismatch via rabenseifner", "count mismatch via mpi", "usable after mismatch", "dtype mismatch",
          "op mismatch", "reducer layout mismatch", "wait for a tensor never marked ready",
          "tensor marked ready twice"]


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.extended)])   # tests/conftest.py's tiers
def test_errors_reach_every_rank_and_timeouts_name_the_missing_rank(ranks):
    result = run_ranks(ranks, PROGRAM, timeout=100, env={"TNT_TIMEOUT_SECONDS": "3"})
    assert result.returncode == 7, result.describe()
    result.assert_printed(CHECKS, range(ranks))
    for rank in range(ranks - 1):
        assert re.search(rf"TIMEOUT .*timed out after \d+ s waiting for rank {ranks - 1}\b",
                         result.rank_stdout.get(rank, "")), result.describe()
    # The job ended because rank 0 exited with 7, and the launcher names it.
    assert "rank 0" in result.stderr, result.describe()
    idle = re.search(r"IDLE cpu=([\d.]+)s wall=([\d.]+)s", result.rank_stdout[0])
    cpu, wall = float(idle.group(1)), float(idle.group(2))
    assert wall > 1.0 and cpu < 0.5 * wall, f"a waiting rank burnt {cpu:.2f} s of CPU in {wall:.2f} s"
