"""Special values, closing without collectives in destructors, and a failed group (2 ranks, one host)."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_group_failure.py")
BOTH_RANKS = ["min max NaN and signed zeros bitwise", "reducer collected on one rank starts no collective",
              "closed group refuses", "close fails a blocking wait", "pending delivery fails when the reducer goes",
              "refused at once after a timeout"]


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_failed_group_refuses_at_once_and_keeps_buffers():
    # Quiet, about 15 s: two 3 s timeouts plus start-up.
    result = run_ranks(2, PROGRAM, timeout=120, env={"TNT_TIMEOUT_SECONDS": "3"})
    for rank in range(2):
        lines = result.rank_stdout.get(rank, "")
        for check in BOTH_RANKS:
            assert f"OK {check}\n" in lines, f"rank {rank} missed {check!r}\n{result.describe()}"
        assert re.search(r"TIMEOUT .*timed out after \d+ s", lines), result.describe()
        assert "LEAVING" in lines, result.describe()
    assert "OK failed call's buffers kept\n" in result.rank_stdout[0], result.describe()
    # Both ranks left normally, but without MPI_Finalize after the failure: the job fails, naming why.
    assert result.returncode != 0, result.describe()
    assert "not finalising MPI, because a collective failed earlier" in result.stdout + result.stderr, \
        result.describe()
