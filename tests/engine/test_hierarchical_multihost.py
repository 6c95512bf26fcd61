"""The hierarchical allreduce across hosts of a namespace cluster (tests/cluster/netns_fixture.py).

2 hosts x 2 ranks: `auto` is hierarchical; every algorithm is right and bitwise
equal on all ranks and across runs; the hierarchical allreduce and Rabenseifner send
at most 1.1 x the bandwidth-optimal bytes over each host's link. 3 + 1 ranks (unequal per host): `auto` and an
explicit `hierarchical` fall back to the flat algorithm alike on every rank
(Note [Choosing an algorithm] in csrc/engine/allreduce.hpp), with no hang.
Both runs put 4 ranks on 2 cores: the engine counts ranks per machine, not per
emulated host, so waiting ranks yield.
"""
from __future__ import annotations

import os
import re

import pytest

from tests.cluster.netns_fixture import netns_cluster  # noqa: F401  (the fixture)
from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "check_hierarchical.py")


@pytest.mark.multirank
@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout,expected_auto", [((2, 2), "hierarchical"), ((3, 1), "flat")])
def test_hierarchical_allreduce_across_hosts(netns_cluster, layout, expected_auto):
    # Quiet, about 60 s each (4 ranks on 2 cores).
    cluster = netns_cluster(hosts=2, slots=max(layout))
    hosts = ",".join(f"{host}:{count}" for host, count in zip(cluster.hosts, layout))
    args = cluster.launcher_args()
    args = ["-H", hosts] + args[args.index("--launch-agent"):]  # the hostfile's slots replaced by the layout
    devices = ",".join(cluster.veth(host) for host in cluster.hosts)
    result = run_ranks(sum(layout), PROGRAM, args=[expected_auto, devices, str(os.getpid())], launcher_args=args,
                       timeout=260,
                       env={"TF_CPP_MIN_LOG_LEVEL": "2"}).check()
    counts = {rank: re.search(r"CHECKED (\d+)", text) for rank, text in result.rank_stdout.items()}
    assert sorted(counts) == list(range(sum(layout))), result.describe()
    assert all(match and int(match.group(1)) > 500 for match in counts.values()), result.describe()
    assert len({match.group(1) for match in counts.values()}) == 1, result.describe()
    assert "LINK hierarchical" in result.rank_stdout[0], result.describe()
    assert cluster.wait_until_clean(10) == {}
