"""The engine's peer channels, through their Python face, on 2 and 4 ranks."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_channels.py")
CHECKS = ["out of order sizes 0..4MiB", "many in flight", "size mismatch", "cancelled receive", "done"]


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [2, 4])
def test_transfers_arrive_intact_and_a_missing_sender_is_named(ranks):
    result = run_ranks(ranks, PROGRAM, timeout=100, env={"TNT_TIMEOUT_SECONDS": "3"}).check()
    result.assert_printed(CHECKS, range(ranks))
    for rank in range(0, ranks, 2):
        assert re.search(rf"TIMEOUT receive of 12 bytes from rank {rank + 1} with tag 99 timed out after \d+ s",
                         result.rank_stdout[rank]), result.describe()


P2P_PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_p2p_ops.py")
P2P_CHECKS = ["round trips 4B..4MiB", "a send arrives while its sender computes", "done"]


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_in_graph_transfers_arrive_intact_and_a_lost_one_expires():
    result = run_ranks(2, P2P_PROGRAM, timeout=130, env={"TNT_TIMEOUT_SECONDS": "3"}).check()
    for rank in range(2):
        for check in P2P_CHECKS:
            assert f"OK {check}\n" in result.rank_stdout.get(rank, ""), f"rank {rank}: {check}\n{result.describe()}"
    found = re.search(r"TIMEOUT after ([\d.]+) s: .*receive of 12 bytes from rank 1 with tag 99 timed out after",
                      result.rank_stdout[0])
    assert found, result.describe()
    assert float(found.group(1)) < 30, result.describe()
