"""The fault matrix (tests/cluster/fault_matrix.py) as tests: each fault on a fresh
2-host namespace cluster must end the job in time, non-zero, with a first report line
naming rank, host and cause, and leave nothing behind on any host."""
from __future__ import annotations

import pytest

from tests.cluster.fault_matrix import FAULTS, MARGIN_SECONDS, START_LIMIT, run_fault

# start, the fault, the end and the leftovers check, with room to spare
HARD_LIMIT = START_LIMIT + max(fault.timeout for fault in FAULTS) + MARGIN_SECONDS + 60


@pytest.mark.multirank
@pytest.mark.timeout(HARD_LIMIT)
@pytest.mark.parametrize("fault", FAULTS, ids=[fault.name for fault in FAULTS])
def test_a_fault_ends_the_job_and_names_its_cause(netns_cluster, fault):
    cluster = netns_cluster(hosts=2, slots=1)
    row = run_fault(fault, cluster)
    assert row.problems() == [], row
