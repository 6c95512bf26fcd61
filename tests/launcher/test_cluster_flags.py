"""-H, --launch-agent, --network-interface, --launch-timeout: what they map to (via
--dry-run), their bad input, and the launch check of the supervisor (without MPI)."""
from __future__ import annotations

import sys
import time

import pytest

from tarantella.launcher import main
from tarantella.launcher.launch_check import LaunchProgress
from tarantella.launcher.network import local_addresses
from tarantella.launcher.rank_wrapper import encode_exit_record, encode_start_record
from tarantella.launcher.supervisor import run_job

from .dry_run import MPICH_LAUNCHER, OPENMPI_LAUNCHER, USER_HOST, dry_run, launcher_part


def _a_subnet() -> str:
    name, address = next(iter(local_addresses().items()))
    return address.rsplit(".", 1)[0] + ".0/24"


def test_host_list_places_ranks_like_a_hostfile(capsys, script, tmp_path):
    words = launcher_part(dry_run(capsys, ["-H", "a:2,b:2", script]))
    assert words[words.index("-n") + 1] == "4" and words[words.index("--host") + 1] == "a:2,b:2"
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb:2\n")
    assert launcher_part(dry_run(capsys, ["--hostfile", str(hosts), script])) == words
    words = launcher_part(dry_run(capsys, ["-H", "a,b", "-n", "2", script]))
    assert words[words.index("--host") + 1] == "a:1,b:1"


def test_agent_and_interface_map_to_open_mpi_options(capsys, script):
    subnet = _a_subnet()
    words = launcher_part(dry_run(capsys, ["-H", "a,b", "--launch-agent", "/bin/true -p 22",
                                           "--network-interface", subnet, script]))
    text = " ".join(words)
    assert "--mca plm_rsh_agent" in text and words[words.index("plm_rsh_agent") + 1] == \
        "/bin/true -p 22"
    assert words[words.index("btl_tcp_if_include") + 1] == subnet
    assert words[words.index("oob_tcp_if_include") + 1] == subnet
    # and nothing of it by default
    plain = " ".join(launcher_part(dry_run(capsys, ["-H", "a,b", script])))
    assert "--mca" not in plain and "tree_spawn" not in plain


def test_agent_and_interface_map_to_mpich_options(capsys, script):
    words = launcher_part(dry_run(capsys, ["-H", "a,b", "--launch-agent", "/bin/true",
                                           "--network-interface", "lo", script],
                                  launcher=MPICH_LAUNCHER))
    assert words[words.index("-launcher-exec") + 1] == "/bin/true"
    assert words[words.index("-iface") + 1] == "lo"


BAD = {
    "-H count zero": (["-H", "a:0,b:2"], "'a'"),
    "-H count not a number": (["-H", "a:2,b:x"], "'x'"),
    "-H empty host": (["-H", "a:2,:2"], "no host name"),
    "-H host twice": (["-H", "a:1,a:2"], "'a'"),
    "-H and --hostfile": (["-H", "a", "--hostfile", "/etc/hostname"], "one of them"),
    "-H too few slots": (["-H", "a:1", "-n", "3"], "-n 3"),
    "interface missing": (["--network-interface", "nosuch0"], "'nosuch0'"),
    "subnet not here": (["--network-interface", "198.51.100.0/24"], "198.51.100.0/24"),
    "interface nonsense": (["--network-interface", "1.2.3/xx"], "'1.2.3/xx'"),
    "agent missing": (["--launch-agent", "/nonexistent/agent"], "/nonexistent/agent"),
    "agent empty": (["--launch-agent", ""], "--launch-agent is empty"),
    "launch timeout bad": (["--launch-timeout", "0"], "--launch-timeout"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cluster_input_is_one_line_naming_it(case, capsys, script):
    argv, named = BAD[case]
    code = main([*argv, script], launcher=OPENMPI_LAUNCHER, local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tarantella: error: ") and err.count("\n") == 1, err
    assert named in err, err


def test_mpich_refuses_a_subnet(capsys, script):
    code = main(["--network-interface", _a_subnet(), script], launcher=MPICH_LAUNCHER,
                local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and "interface name" in err and err.count("\n") == 1


def _fake_mpirun(started_ranks, then, finished=()):
    """A command that prints start records for some ranks, and the records of those `finished` (exit 0), as
    ranks' wrappers would."""
    lines = b"".join(encode_start_record(rank, f"h{rank}") for rank in started_ranks)
    lines += b"".join(encode_exit_record({"rank": rank, "host": f"h{rank}", "exit_code": 0, "signal": None,
                                          "cause": "finished", "end_time": 1.0}) for rank in finished)
    return [sys.executable, "-c",
            f"import sys, time; print('held output'); sys.stdout.flush(); "
            f"sys.stderr.buffer.write({lines!r}); sys.stderr.write('Remote host: h1\\n'); "
            f"sys.stderr.flush(); {then}"]


@pytest.mark.timeout(30)
def test_a_launch_that_ends_before_every_rank_started_is_one_line(capfd):
    progress = LaunchProgress(2, (("h0", 1), ("h1", 1)), "/bin/agent")
    assert run_job(_fake_mpirun([0], "sys.exit(213)"), launch=progress, launch_timeout=20) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("tarantella: error: cannot start the ranks on host h1: mpirun exited "
                          "with code 213 before 1 of 2 rank(s) started")


@pytest.mark.timeout(30)
def test_a_launch_that_hangs_is_stopped_after_the_launch_timeout(capfd):
    progress = LaunchProgress(2, (("h0", 1), ("h1", 1)), None)
    start = time.monotonic()
    code = run_job(_fake_mpirun([0], "time.sleep(60)"), launch=progress, launch_timeout=1.0)
    assert code == 2 and time.monotonic() - start < 8
    err = capfd.readouterr().err
    assert "had not started after 1 s (--launch-timeout)" in err and err.count("\n") == 1


@pytest.mark.timeout(30)
def test_output_held_during_the_launch_is_passed_on_once_all_started(capfd):
    progress = LaunchProgress(2, (("h0", 1), ("h1", 1)), None)
    assert run_job(_fake_mpirun([0, 1], "print('after')", finished=[0, 1]), launch=progress,
                   launch_timeout=20) == 0
    out, err = capfd.readouterr()
    assert out == "held output\nafter\n" and err == "Remote host: h1\n"


@pytest.mark.timeout(30)
def test_an_mpirun_that_exits_0_after_a_rank_ended_without_a_word_is_a_failure(capfd):
    """A node that Slurm removed from a --no-kill job: its daemon's step is killed, mpirun ends the other ranks
    and exits 0 (Note [Exit records])."""
    progress = LaunchProgress(2, (("h0", 1), ("h1", 1)), None)
    assert run_job(_fake_mpirun([0, 1], "print('after')", finished=[0]), launch=progress, launch_timeout=20) == 1
    err = capfd.readouterr().err.splitlines()
    assert err[-1] == (f"tarantella: error: {sys.executable} exited with 0, but rank(s) 1 on host(s) h1 never "
                       f"reported their end: the MPI or the batch system ended them (a node lost or removed from "
                       f"the job?)"), err
