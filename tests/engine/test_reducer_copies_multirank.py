"""The fused reducer's two-copy data path on one node (Note [Two copies per gradient byte]), 1-3 ranks."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_reducer_copies.py")


@pytest.mark.multirank
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_shared_buckets_copy_each_byte_twice_and_sum_exactly(ranks):
    # Quiet, about 10 s per run; 3 ranks share 2 cores.
    result = run_ranks(ranks, PROGRAM, timeout=120 * ranks).check()
    found = {rank: re.search(r"CHECKED (\d+) COPIES_PER_BYTE \[2\.0\]", text)
             for rank, text in result.rank_stdout.items()}
    assert sorted(found) == list(range(ranks)) and all(found.values()), result.describe()
