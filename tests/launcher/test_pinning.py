"""Pinning ranks to sockets with numactl."""
import os
import shutil
import sys

import pytest

from tarantella.launcher import main
from tarantella.launcher.pinning import (NumaNode, PinningError, check_ranks_fit,
                                         numactl_prefixes, parse_numactl_hardware,
                                         probe_numa_nodes)
from tarantella.launcher.rank_wrapper import child_command, _PinningError

from .dry_run import USER_HOST, dry_run, wrapper_part
from tests.multirank import run_ranks

TWO_SOCKETS = """available: 3 nodes (0-2)
node 0 cpus: 0 1 2 3
node 0 size: 64000 MB
node 1 cpus: 4 5 6 7
node 1 size: 64000 MB
node 2 cpus:
node 2 size: 32000 MB
node distances:
node   0   1   2
  0:  10  21  30
"""
NODES = [NumaNode(0, (0, 1, 2, 3)), NumaNode(1, (4, 5, 6, 7))]
HAS_NUMACTL = shutil.which("numactl") is not None


def test_parse_skips_nodes_without_cpus():
    assert parse_numactl_hardware(TWO_SOCKETS) == NODES


def test_prefix_per_local_rank():
    assert numactl_prefixes(NODES, membind=False) == [
        "numactl --cpunodebind=0 --preferred=0", "numactl --cpunodebind=1 --preferred=1"]
    assert numactl_prefixes(NODES, membind=True) == [
        "numactl --cpunodebind=0 --membind=0", "numactl --cpunodebind=1 --membind=1"]
    program = ["python", "train.py"]
    assert child_command(program, 1, numactl_prefixes(NODES, False)) == \
        ["numactl", "--cpunodebind=1", "--preferred=1", "python", "train.py"]
    assert child_command(program, 0, []) == program
    with pytest.raises(_PinningError, match="local rank 2 has no socket"):
        child_command(program, 2, numactl_prefixes(NODES, False))


def test_too_many_ranks_per_socket():
    check_ranks_fit(2, NODES)
    with pytest.raises(PinningError, match="3 ranks per host.*2 NUMA node"):
        check_ranks_fit(3, NODES)


def test_dry_run_pins_each_local_rank(capsys, script):
    options = wrapper_part(dry_run(capsys, ["-n", "2", "--pin-to-socket", script],
                                   probe_numa=lambda: NODES))
    assert options == ["--local-rank-prefix", "numactl --cpunodebind=0 --preferred=0",
                       "--local-rank-prefix", "numactl --cpunodebind=1 --preferred=1",
                       "--threads-per-rank", "4"]
    options = wrapper_part(dry_run(capsys, ["-n", "1", "--pin-memory-to-socket", script],
                                   probe_numa=lambda: NODES))
    assert options[:2] == ["--local-rank-prefix", "numactl --cpunodebind=0 --membind=0"]


def test_more_ranks_per_host_than_sockets(capsys, script, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    code = main(["--hostfile", str(hosts), "--npernode", "3", "--pin-to-socket", script],
                probe_numa=lambda: NODES, local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tarantella: error: pinning puts each rank")
    assert "3 ranks per host" in err and err.count("\n") == 1


@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl is not installed")
def test_this_machine_refuses_more_ranks_than_its_numa_nodes(capsys, script):
    nodes = probe_numa_nodes()
    code = main(["-n", str(len(nodes) + 1), "--pin-to-socket", "--dry-run", script])
    err = capsys.readouterr().err
    assert code == 2 and f"{len(nodes)} NUMA node(s)" in err


def test_missing_numactl(capsys, script, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PinningError, match="need numactl"):
        probe_numa_nodes()
    code = main(["--pin-to-socket", "--dry-run", script], local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and "need numactl, which is not on PATH" in err


SHOW = """
import os, subprocess, sys
show = subprocess.run(["numactl", "--show"], capture_output=True, text=True, check=True).stdout
print(show.replace("\\n", " | "))
print("threads", os.environ["OMP_NUM_THREADS"], "cpus", len(os.sched_getaffinity(0)))
"""


@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl is not installed")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag, policy", [("--pin-to-socket", "preferred"),
                                          ("--pin-memory-to-socket", "bind")])
def test_a_pinned_rank_sees_its_binding(flag, policy):
    node = probe_numa_nodes()[0]
    result = run_ranks(1, SHOW, launcher_args=[flag], timeout=30).check()
    show, threads = result.rank_stdout[0].splitlines()
    assert f"nodebind: {node.id} " in show
    assert f"policy: {policy} " in show
    if policy == "bind":
        assert f"membind: {node.id} " in show
    else:
        assert f"preferred node: {node.id} " in show
    assert threads == f"threads {len(node.cpus)} cpus {len(node.cpus)}"
