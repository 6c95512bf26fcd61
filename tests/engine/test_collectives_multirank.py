"""Every collective and the fused reducer on 1-4 ranks, through the launcher."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_collectives.py")


@pytest.mark.multirank
@pytest.mark.timeout(900)
@pytest.mark.parametrize("ranks", [1, 2, *(pytest.param(n, marks=pytest.mark.extended) for n in (3, 4))])
def test_collectives_match_numpy_and_agree_bitwise(ranks):
    # Quiet, this takes 15-70 s; 3 and 4 ranks share 2 cores, so allow for a busy machine.
    result = run_ranks(ranks, PROGRAM, timeout=200 * ranks).check()
    counts = {rank: re.search(r"CHECKED (\d+)", text) for rank, text in result.rank_stdout.items()}
    assert sorted(counts) == list(range(ranks)), result.describe()
    assert all(match and int(match.group(1)) > 1000 for match in counts.values()), result.describe()
    # Every rank ran the same checks.
    assert len({match.group(1) for match in counts.values()}) == 1, result.describe()
