"""The per-rank memory budget (--memory-budget) is enforced on each rank's peak resident memory, and a
pipelined model built in tnt.deferred_weights() fits a budget that the same model's data parallelism
(every rank holding all weights, gradients and Adam's state) exceeds (issue 20 §4), as does the same data
parallelism with its gradients and optimizer state sharded (shard="gradients", issue 21)."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "fit_in_budget.py")
WIDTH = "3072"              # 8 x Dense(3072): 302 MB of weights; with gradients and Adam's state 1.2 GB
BUDGET = ["--memory-budget", "2000MiB"]


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_a_deferred_pipeline_trains_within_a_budget_that_data_parallelism_exceeds():
    fits = run_ranks(2, PROGRAM, args=["pipeline", WIDTH], launcher_args=BUDGET, timeout=90)
    fits.check()
    peaks = [int(re.search(r"OK trained, peak (\d+) MiB", fits.rank_stdout[r]).group(1)) for r in range(2)]
    assert max(peaks) <= 2000, fits.describe()
    sharded = run_ranks(2, PROGRAM, args=["sharded", WIDTH], launcher_args=BUDGET, timeout=90)
    sharded.check()
    peaks = [int(re.search(r"OK trained, peak (\d+) MiB", sharded.rank_stdout[r]).group(1)) for r in range(2)]
    assert max(peaks) <= 2000, sharded.describe()
    over = run_ranks(2, PROGRAM, args=["data", WIDTH], launcher_args=BUDGET, timeout=90)
    assert over.returncode != 0, over.describe()
    assert re.search(r"^tarantella: error: rank \d of 2 failed first: it exited with code 3 on host \S+: "
                     r"MemoryBudgetError: rank \d on host \S+: peak resident memory \d+ MiB exceeds the per-rank "
                     r"budget of 2000 MiB", over.stderr, re.MULTILINE), over.describe()
