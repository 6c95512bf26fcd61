"""pytest fixtures: a cluster of network namespaces (bench/cluster/netns_cluster.py).

    def test_two_hosts(netns_cluster):
        cluster = netns_cluster(hosts=2, slots=1)
        result = run_ranks(2, PROGRAM, launcher_args=cluster.launcher_args(), timeout=90)

`netns_cluster(hosts, slots)` brings a cluster up (skipping the test, with the
reason, where namespaces cannot be made: not root, no iproute2) and removes it
when the test ends, passes, fails or is interrupted (a finalizer; SIGTERM is turned
into KeyboardInterrupt so that pytest runs finalizers then too; a run killed
outright leaves a stale cluster that the next create() removes, Note [Cluster
lifetime]). Use it from another test directory with
`from tests.cluster.netns_fixture import netns_cluster  # noqa: F401`.
"""
from __future__ import annotations

import functools
import signal

import pytest

from bench.cluster.netns_cluster import NetnsCluster, create, why_unavailable

__all__ = ["netns_cluster", "skip_reason", "interrupt_on_sigterm"]


@functools.lru_cache(maxsize=1)
def skip_reason() -> str | None:
    return why_unavailable()


def interrupt_on_sigterm() -> None:
    """SIGTERM becomes KeyboardInterrupt, so that pytest runs the finalizers then too."""
    def raise_interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, raise_interrupt)


@pytest.fixture
def netns_cluster(request):
    reason = skip_reason()
    if reason:
        pytest.skip(f"no namespace cluster: {reason}")
    interrupt_on_sigterm()

    def make(hosts: int = 2, slots: int = 1) -> NetnsCluster:
        cluster = create(hosts, slots)
        request.addfinalizer(cluster.down)
        return cluster
    return make
