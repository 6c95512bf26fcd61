"""The per-rank wrapper, without MPI: identity, thread defaults, records, output."""
import os
import subprocess
import sys

import pytest

from tarantella.launcher.mpirun_command import WRAPPER_PATH
from tarantella.launcher.rank_wrapper import (EXIT_RECORD_MARKER, INTEROP_THREADS,
                                              decode_exit_record, decode_start_record,
                                              core_share, encode_exit_record, rank_identity,
                                              interop_threads, thread_defaults)


@pytest.mark.parametrize("environ, expected", [
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (5, 8, 1, 4)),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (3, 4, 1, 2)),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
      "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}, (4, 5, 0, 1)),
    ({}, (0, None, 0, None)),
])
def test_rank_identity(environ, expected):
    me = rank_identity(environ)
    assert (me.rank, me.size, me.local_rank, me.local_size) == expected


def test_thread_defaults_share_the_cpus():
    assert thread_defaults({}, cpus=8, ranks_sharing=3) == {
        "OMP_NUM_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "2",
        "TF_NUM_INTEROP_THREADS": str(INTEROP_THREADS)}
    assert thread_defaults({}, cpus=2, ranks_sharing=3)["OMP_NUM_THREADS"] == "1"
    # A share of one CPU gets one inter-op thread: two would only take turns on it.
    assert thread_defaults({}, cpus=2, ranks_sharing=2)["TF_NUM_INTEROP_THREADS"] == "1"
    assert thread_defaults({}, cpus=4, ranks_sharing=2)["TF_NUM_INTEROP_THREADS"] == str(INTEROP_THREADS)
    assert thread_defaults({}, cpus=8, ranks_sharing=None)["OMP_NUM_THREADS"] == "8"
    assert thread_defaults({}, cpus=64, ranks_sharing=8, threads_per_rank=16)[
        "TF_NUM_INTRAOP_THREADS"] == "16"


def test_thread_defaults_never_override():
    assert thread_defaults({"OMP_NUM_THREADS": "3", "TF_NUM_INTEROP_THREADS": "1"}, 8, 1) == \
        {"TF_NUM_INTRAOP_THREADS": "8"}


def test_exit_record_round_trip():
    record = {"rank": 3, "exit_code": 1, "stderr_tail": "a\nb\n\"quoted\"", "cause": "failed"}
    line = encode_exit_record(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_exit_record(line.decode().rstrip("\n")) == record
    assert decode_exit_record(EXIT_RECORD_MARKER + '{"rank": 3, "exit') is None
    assert decode_exit_record("some output") is None


def _wrap(program_code, rank, options=(), size=2):
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
           "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(size)}
    done = subprocess.run([sys.executable, WRAPPER_PATH, *options, "--", sys.executable, "-c",
                           program_code], capture_output=True, text=True, env=env, timeout=60)
    return _without_records(done, rank)


def _without_records(done, rank):
    """The wrapper's first stderr line announces the rank (Note [Start records]); after a program that exited
    with 0, its last line says so (Note [Exit records]). Both are taken out, checked."""
    first, _, rest = done.stderr.partition("\n")
    record = decode_start_record(first)
    assert record is not None and record["rank"] == rank and record["host"], done.stderr
    if done.returncode == 0:
        rest, last = rest[:-1].rpartition("\n")[0::2]
        rest += "\n" if rest else ""
        ended = decode_exit_record(last)
        assert ended is not None and ended["cause"] == "finished" and ended["exit_code"] == 0, done.stderr
        assert ended["rank"] == rank and ended["host"] == record["host"] and ended["end_time"] > 0, done.stderr
    done.stderr = rest
    return done


def test_master_is_heard_others_are_silent():
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    master, other = _wrap(code, 0), _wrap(code, 1)
    assert (master.returncode, master.stdout, master.stderr) == (0, "out\n", "err\n")
    assert (other.returncode, other.stdout, other.stderr) == (0, "", "")


def test_all_output_is_tagged_by_rank():
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    done = _wrap(code, 1, ["--output", "all"])
    assert (done.stdout, done.stderr) == ("[1] out\n", "[1] err\n")
    done = _wrap(code, 0, ["--errors", "all"])
    assert (done.stdout, done.stderr) == ("[0] out\n", "[0] err\n")


def test_a_failing_silent_rank_leaves_a_record_with_its_stderr():
    done = _wrap("import sys; print('why', file=sys.stderr); sys.exit(7)", 1)
    assert done.returncode == 7
    line, = done.stderr.splitlines()
    record = decode_exit_record(line)
    assert record["rank"] == 1 and record["exit_code"] == 7 and record["cause"] == "failed"
    assert record["stderr_tail"] == "why\n" and record["stderr_shown"] is False


def test_a_killed_program_ends_the_wrapper_with_the_same_signal():
    done = _wrap("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 0)
    assert done.returncode == -9
    record = decode_exit_record(done.stderr.splitlines()[-1])
    assert (record["exit_code"], record["signal"]) == (137, 9)


def test_a_missing_program_is_reported():
    done = subprocess.run([sys.executable, WRAPPER_PATH, "--", "/nonexistent/program"],
                          capture_output=True, text=True, timeout=60)
    done = _without_records(done, 0)
    assert done.returncode == 127
    assert "cannot run '/nonexistent/program'" in done.stderr
    assert decode_exit_record(done.stderr.splitlines()[-1])["exit_code"] == 127


def test_thread_variables_reach_the_program():
    done = _wrap("import os; print(os.environ['OMP_NUM_THREADS'], "
                 "os.environ['TF_NUM_INTEROP_THREADS'])", 0, size=1)
    cpus = len(os.sched_getaffinity(0))
    assert done.stdout.split() == [str(cpus), str(interop_threads(cpus))]


# ---- binding to a share of the cores (Note [Binding each rank to its share of the cores]) ------------

def _smt(cpu):
    """4 cores of 2 hardware threads, Linux's usual numbering: CPU c and c + 4 are one core's."""
    return 0, cpu % 4


def _two_sockets(cpu):
    return cpu // 4, cpu % 4


def _one_thread_per_core(cpu):
    return 0, cpu


def test_each_local_rank_gets_its_block_of_whole_cores():
    assert [core_share([0, 1], r, 2, core_of=_one_thread_per_core) for r in (0, 1)] == [[0], [1]]
    assert [core_share(range(8), r, 2, core_of=_smt) for r in (0, 1)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [core_share(range(8), r, 4, core_of=_smt) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # Blocks follow socket and core numbers, not CPU numbers: two ranks, one socket each.
    assert [core_share([4, 0, 5, 1, 6, 2, 7, 3], r, 2, core_of=_two_sockets) for r in (0, 1)] == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [core_share(range(4), r, 3, core_of=_one_thread_per_core) for r in range(3)] == [[0], [1], [2]], \
        "the remainder of an uneven split stays unused"
    assert core_share([2, 3], 1, 2, core_of=_one_thread_per_core) == [3], "a share of the mask the rank was given"


def test_no_share_alone_oversubscribed_or_unknown():
    assert core_share(range(4), 0, 1, core_of=_one_thread_per_core) is None
    assert core_share([0, 1], 2, 3, core_of=_one_thread_per_core) is None
    assert core_share(range(8), 1, 5, core_of=_smt) is None, "5 ranks on 4 cores"
    assert core_share(range(4), 0, None) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_bind_cores_runs_the_program_on_its_share_with_threads_to_match():
    program = ("import os; print(sorted(os.sched_getaffinity(0)), os.environ['TF_NUM_INTRAOP_THREADS'], "
               "os.environ['TF_NUM_INTEROP_THREADS'])")
    mask = sorted(os.sched_getaffinity(0))
    for rank in (0, 1):
        share = core_share(mask, rank, 2)
        done = _wrap(program, rank, options=["--bind-cores", "--output", "all"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"[{rank}] {share} {len(share)} {interop_threads(len(share))}", done.stdout
    unbound = _wrap(program, 0)
    assert unbound.stdout.split("]")[0] + "]" == str(mask), unbound.stdout


def test_a_stop_counts_until_the_program_ran_again_for_a_while(tmp_path, monkeypatch):
    """The MPI ends a job by continuing its stopped ranks (SIGCONT) before it terminates them: a rank seen
    stopped a moment ago had hung. While it is stopped, an elastic job's rank keeps its record on the host."""
    from tarantella.launcher import rank_wrapper
    monkeypatch.setenv("TNT_ELASTIC_DIR", str(tmp_path))
    kept = tmp_path / "records" / "h" / "gen-1-rank-3.rec"
    stop = rank_wrapper._Stop()
    stop.identity = {"rank": 3, "host": "h"}
    stop.look("T")
    assert stop.stopped_seconds() > 0 and kept.exists()
    stop.look("S")                      # continued by the job's end
    assert stop.stopped_seconds() > 0 and kept.exists()
    monkeypatch.setattr(rank_wrapper, "_RESUMED_SECONDS", 0.0)
    stop.look("S")                      # running for longer: resumed, not hung
    assert stop.stopped_seconds() == 0 and not kept.exists()
