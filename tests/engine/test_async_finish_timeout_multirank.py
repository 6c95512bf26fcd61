"""An async finish op (fit's path) under the timeout: a bucket that never fills fails the step
on every rank within the timeout's bound, naming the tensor never marked ready; no hang."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_async_finish_timeout.py")
TIMEOUT_SECONDS = 2


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_an_async_finish_whose_bucket_never_fills_fails_instead_of_hanging():
    result = run_ranks(2, PROGRAM, timeout=120, env={"TNT_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS)})
    assert result.returncode == 0, result.describe()
    for rank in range(2):
        out = result.rank_stdout.get(rank, "")
        assert "OK async finish fails naming the missing tensor" in out, result.describe()
        assert "OK later step fails at once" in out, result.describe()
        elapsed = float(re.search(r"ELAPSED ([\d.]+)", out).group(1))
        # Twice the timeout (the bound FusedReducer::wait uses) plus tracing and scheduling slack.
        assert elapsed < 2 * TIMEOUT_SECONDS + 25, f"rank {rank} took {elapsed} s to fail"
