"""A mismatched allreduce across hosts of a namespace cluster (tests/cluster/netns_fixture.py)
gives every rank a clear MismatchError, never a hang: the per-call check runs alongside the
data exchange there (Note [Checking calls alongside the data] in csrc/engine/allreduce_call_check.hpp),
with one rank per host through the messages' tags (Note [Calls checked by their message tags]).
The collective timeout is set far beyond the test's own, so only a prompt error passes.
"""
from __future__ import annotations

import os

import pytest

from tests.cluster.netns_fixture import netns_cluster  # noqa: F401  (the fixture)
from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_mismatch_across_hosts.py")
CHECKS = {
    (2, 1, "count"): ["calls alike are right", "count mismatch before MPI's allreduce",
                      "count mismatch alongside the data", "refused after the mismatch"],
    (2, 2, "count"): ["count mismatch before the first hierarchical call",
                      "usable after a mismatch found before the data moved", "calls alike are right",
                      "count mismatch alongside hierarchical data", "refused after the mismatch"],
    (2, 2, "algorithm"): ["calls alike are right", "algorithm mismatch alongside the data",
                          "refused after the mismatch"],
    # One rank per host: calls are checked by their message tags (Note [Calls checked by their
    # message tags]); ranks whose partners never send learn of the mismatch from a notice.
    (4, 1, "algorithm"): ["calls alike are right", "algorithm mismatch alongside the data",
                          "refused after the mismatch"],
    (3, 1, "count"): ["calls alike are right", "count mismatch before MPI's allreduce",
                      "count mismatch alongside the data", "refused after the mismatch"],
}


@pytest.mark.multirank
@pytest.mark.timeout(200)
@pytest.mark.parametrize("hosts,slots,mode", sorted(CHECKS))
def test_mismatched_calls_across_hosts_raise_promptly(netns_cluster, tmp_path, hosts, slots, mode):
    # Quiet, a few seconds each (no TensorFlow).
    cluster = netns_cluster(hosts=hosts, slots=slots)
    result = run_ranks(hosts * slots, PROGRAM, args=[mode, str(tmp_path)], launcher_args=cluster.launcher_args(), timeout=150,
                       env={"TNT_TIMEOUT_SECONDS": "600", "TF_CPP_MIN_LOG_LEVEL": "2"})
    for rank in range(hosts * slots):
        lines = result.rank_stdout.get(rank, "")
        for check in CHECKS[(hosts, slots, mode)]:
            assert f"OK {check}\n" in lines, f"rank {rank} missed {check!r}\n{result.describe()}"
        assert "LEAVING" in lines, result.describe()
    # The group failed, so the engine leaves MPI unfinalised and the job ends non-zero, saying why.
    assert result.returncode != 0, result.describe()
    assert "not finalising MPI, because a collective failed earlier" in result.stdout + result.stderr, \
        result.describe()
    assert cluster.wait_until_clean(10) == {}
