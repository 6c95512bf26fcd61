"""The namespace cluster itself: hosts with their own hostname, /dev/shm and link; and
it is always removed (with the root-namespace daemons it adopted): by down(), when its
owner died, when `run` is interrupted."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from bench.cluster.netns_cluster import list_clusters, create, remove_stale
from tests.cluster.netns_fixture import skip_reason
from tests.multirank import REPO_ROOT


def _namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.timeout(60)
def test_hosts_have_their_own_name_shm_and_link(netns_cluster):
    cluster = netns_cluster(hosts=2, slots=3)
    assert open(cluster.hostfile).read().splitlines()[1:] == \
        [f"{host} slots=3" for host in cluster.hosts]
    h0, h1 = cluster.hosts
    probe = "import socket, os; print(socket.gethostname(), sorted(os.listdir('/dev/shm')))"
    done = cluster.run_on(h0, [sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30)
    assert done.stdout == f"{h0} []\n", done.stderr
    # h1 listens, h0 connects over the bridge: h0's link counts the bytes it sent
    server_code = (f"import socket\ns = socket.create_server(('{cluster.address(h1)}', 5999))\n"
                   "print('up', flush=True)\nc, _ = s.accept()\nn = 0\n"
                   "while (d := c.recv(65536)):\n    n += len(d)\nprint(n)\n")
    server = subprocess.Popen([cluster.agent, h1, shlex.join([sys.executable, "-c",
                                                                server_code])],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "up\n"
    before = cluster.link_bytes(h0)
    cluster.run_on(h0, [sys.executable, "-c", f"import socket; socket.create_connection(("
                        f"'{cluster.address(h1)}', 5999)).sendall(b'x' * 50000)"],
                   timeout=30, check=True)
    assert server.stdout.readline() == "50000\n"
    server.wait(timeout=30)
    after = cluster.link_bytes(h0)
    assert after["sent"] - before["sent"] >= 50000
    assert cluster.leftovers() == {}


@pytest.mark.timeout(60)
def test_a_cluster_whose_owner_died_is_removed():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    gone = subprocess.Popen(["true"])
    gone.wait()
    cluster = create(hosts=1, owner_pid=gone.pid)
    # a daemon of the root namespace serving the cluster (as Slurm's controller does)
    daemon = subprocess.Popen(["sleep", "120"])
    try:
        cluster.adopt(daemon.pid)
        assert cluster.hosts[0] in _namespaces()
        assert cluster.name in remove_stale()
        assert cluster.hosts[0] not in _namespaces()
        assert cluster.name not in [c.name for c in list_clusters()]
        assert not os.path.exists(cluster.directory)
        assert daemon.wait(timeout=10) == -signal.SIGKILL
    finally:
        daemon.kill()
        cluster.down()


@pytest.mark.timeout(60)
def test_run_removes_its_cluster_when_interrupted():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    before = {c.name for c in list_clusters()}
    process = subprocess.Popen([sys.executable, "-m", "bench.cluster", "run", "--hosts", "2",
                                "--", "sleep", "60"], cwd=REPO_ROOT, stderr=subprocess.PIPE,
                               text=True)
    line = process.stderr.readline()
    assert line.startswith("netns cluster "), line
    name = line.split()[2].rstrip(":")
    assert name in {c.name for c in list_clusters()} - before
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) != 0
    deadline = time.monotonic() + 5
    while any(ns.startswith(name) for ns in _namespaces()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(ns.startswith(name) for ns in _namespaces())
    assert name not in {c.name for c in list_clusters()}
