"""pytest fixtures: real Slurm clusters made of Debian's daemons (slurm_cluster.py).

    def test_x(slurm):                 # one node: this machine
        done = slurm.batch(["-n", "2", "--wrap", "..."], timeout=120)  # sbatch; waits

    def test_y(slurm_on_hosts):        # two nodes: the hosts of a namespace cluster
        done = slurm_on_hosts.batch(["-N", "2", "-n", "2", ...], timeout=...)
        slurm_on_hosts.hosts           # the namespace cluster (its hosts = node names)

`.env` (SLURM_CONF=...) points Slurm's commands at the cluster. Both are module
scoped: started once for a test file, stopped (jobs cancelled, daemons ended) when
it is done, also when a test fails. Where the daemons cannot run (not root,
packages missing, no namespaces, a daemon does not come up), the tests skip with
the reason.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

from bench.cluster.netns_cluster import ClusterError, create

from .netns_fixture import interrupt_on_sigterm, skip_reason as why_no_namespaces
from .slurm_cluster import SlurmStartError, one_node, on_namespace_hosts, why_no_slurm

__all__ = ["slurm", "slurm_on_hosts"]

_START_FAILED = (SlurmStartError, OSError, subprocess.SubprocessError)


@pytest.fixture(scope="module")
def slurm():
    reason = why_no_slurm()
    if reason:
        pytest.skip(f"no Slurm: {reason}")
    directory = tempfile.mkdtemp(prefix="tnt-slurm-")
    cluster = one_node(directory)
    try:
        try:
            cluster.start()
        except _START_FAILED as error:
            cluster.stop()
            pytest.skip(f"the one-node Slurm cluster did not start: {error}")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_on_hosts():
    """Slurm with one node per host of a 2-host namespace cluster (Note [Slurm across
    namespace hosts] in slurm_cluster.py); `.hosts` is that namespace cluster."""
    reason = why_no_slurm() or why_no_namespaces()
    if reason:
        pytest.skip(f"no Slurm across namespace hosts: {reason}")
    interrupt_on_sigterm()
    try:
        hosts = create(hosts=2, slots=1)
    except ClusterError as error:
        pytest.skip(f"no namespace cluster: {error}")
    # A node silent for 8 s is DOWN (Slurm's default: 300 s), so that a test sees Slurm remove a lost node
    # from its job within the job (test_slurm_hosts.py, the elastic job that loses a node).
    slurm = on_namespace_hosts(hosts, slurmd_timeout=8)
    slurm.hosts = hosts
    try:
        try:
            slurm.start()
        except _START_FAILED as error:
            pytest.skip(f"Slurm did not start on the namespace hosts: {error}")
        yield slurm
    finally:
        slurm.stop()
        hosts.down()
