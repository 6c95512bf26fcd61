"""Sharded training (ZeRO stages 1-3, issue 21) at 3 ranks on 3 hosts of a namespace cluster, every variable
sent in parts relayed by every rank (--shard-spread 0, Note [Spread transfers]): bitwise unsharded training, as
on one node (the checks of tests/keras/test_sharded_optimizer.py and test_sharded_weights.py)."""
from __future__ import annotations

import re

import pytest

from tests.keras import test_sharded_optimizer, test_sharded_weights
from tests.multirank import run_ranks

ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TNT_SHARD_SPREAD_KB": "0"}


@pytest.mark.multirank
@pytest.mark.extended   # one host: tests/keras/test_sharded_*.py (Note [The suite's two tiers] in tests/conftest.py)
@pytest.mark.timeout(900)
def test_sharded_training_across_hosts_spreads_variables_and_trains_as_unsharded(netns_cluster):
    cluster = netns_cluster(hosts=3, slots=1)
    result = run_ranks(3, test_sharded_weights.PROGRAM, launcher_args=cluster.launcher_args(), env=ENV,
                       timeout=400).check()
    test_sharded_weights.assert_trained_as_unsharded(result, 3)
    spread = [int(n) for n in re.findall(r"SPREAD (\d+)", result.stdout)]
    assert len(spread) == 3 and min(spread) > 0, f"no variable went in parts: {spread}\n{result.describe()}"
    result = run_ranks(3, test_sharded_optimizer.PROGRAM, launcher_args=cluster.launcher_args(), env=ENV,
                       timeout=440).check()
    test_sharded_optimizer.assert_trained_as_unsharded(result, 3)
    assert cluster.wait_until_clean(10) == {}
