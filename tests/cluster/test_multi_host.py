"""Jobs across hosts of a namespace cluster (tests/cluster/netns_fixture.py): the world,
the engine's view of the nodes, and a training step equal on every rank."""
from __future__ import annotations

import os

import pytest

from tests.cluster.results import rank_results
from tests.multirank import run_ranks

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


@pytest.mark.multirank
@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts,slots,train", [(2, 1, True), (2, 2, False)])
def test_a_job_spans_the_hosts_and_trains_alike_on_all(netns_cluster, hosts, slots, train):
    """2 hosts x 1 rank train; 2 x 2 (4 ranks on 2 cores) check the layout only."""
    cluster = netns_cluster(hosts=hosts, slots=slots)
    n = hosts * slots
    run = run_ranks(n, os.path.join(PROGRAMS, "multi_host_step.py"),
                    args=[] if train else ["layout-only"],
                    launcher_args=cluster.launcher_args(), env=ENV, timeout=200).check()
    found = rank_results(run.stdout)
    assert sorted(found) == list(range(n)), run.describe()
    for rank, values in found.items():
        # block placement: ranks fill the hostfile's hosts in order
        assert values["host"] == cluster.hosts[rank // slots], values
        assert values["size"] == n
        assert values["on_one_node"] is False
        assert values["mpi_local_rank"] == rank % slots and values["mpi_local_size"] == slots
        # the engine's own view of the nodes (MPI_Comm_split_type(SHARED) per host)
        assert values["node_count"] == hosts, values
        assert values["local_rank"] == rank % slots and values["local_size"] == slots
        assert values["allreduce_ok"], values
        if train:
            assert values["weights_changed"]
            assert values["serial_difference"] < 1e-5, values
    if train:
        assert len({values["weights_sha256"] for values in found.values()}) == 1, found
        assert len({values["loss"] for values in found.values()}) == 1, found
    assert cluster.wait_until_clean(10) == {}
