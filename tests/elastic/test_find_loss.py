"""Which ranks a failed generation lost, and where the next one runs (Note [Elastic generations])."""
from __future__ import annotations

from tarantella.launcher.elastic import find_loss, survivors
from tarantella.launcher.launch_plan import LaunchPlan
from tarantella.launcher.supervisor import JobEnd


def _plan(hosts=(("h0", 2), ("h1", 2)), nranks=None) -> LaunchPlan:
    return LaunchPlan(nranks=nranks or sum(c for _, c in hosts), hosts=tuple(hosts), npernode=None,
                      ranks_per_host=nranks or max(c for _, c in hosts), program=("python", "t.py"), rank_env={},
                      output_all=False, errors_all=False)


def _record(rank, host, cause="stopped", signal=None, tail="", exit_code=143, **extra):
    return {"rank": rank, "host": host, "cause": cause, "signal": signal, "stderr_tail": tail,
            "exit_code": exit_code, "end_time": float(rank), **extra}


def _end(records, hosts=("h0", "h0", "h1", "h1")) -> JobEnd:
    return JobEnd(1, records, dict(enumerate(hosts)), [], None, False, 4.0, "mpirun")


TIMEOUT = ("CollectiveTimeoutError: gradient reducer (waiting for the peers' gradients) timed out after 5 s "
           "waiting for rank 3: ...")


def test_a_killed_rank_gives_up_its_slot_only():
    end = _end([_record(1, "h0", "failed", signal=9, exit_code=137), _record(0, "h0"), _record(2, "h1"),
                _record(3, "h1")])
    loss = find_loss(end, _plan())
    assert list(loss.ranks) == [1] and "SIGKILL" in loss.ranks[1] and not loss.silent_hosts
    assert survivors(_plan(), end, loss) == [("h0", 1), ("h1", 2)]


def test_a_silent_host_is_dropped_whole():
    # h1's network is gone: nothing came from ranks 2 and 3; the others timed out waiting for rank 2.
    tail = TIMEOUT.replace("rank 3", "rank 2")
    end = _end([_record(0, "h0", "failed", tail=tail, exit_code=1), _record(1, "h0", "failed", tail=tail,
                                                                          exit_code=1)])
    loss = find_loss(end, _plan())
    assert sorted(loss.ranks) == [2, 3] and loss.silent_hosts == {1}
    assert survivors(_plan(), end, loss) == [("h0", 2)]


def test_a_stopped_rank_and_the_rank_its_peers_waited_for_are_lost():
    end = _end([_record(3, "h1", stopped_for=7.0), _record(0, "h0", "failed", tail=TIMEOUT, exit_code=1),
                _record(1, "h0"), _record(2, "h1")])
    loss = find_loss(end, _plan())
    assert list(loss.ranks) == [3]
    assert survivors(_plan(), end, loss) == [("h0", 2), ("h1", 1)]


def test_a_program_failing_on_its_own_is_no_loss():
    end = _end([_record(2, "h1", "failed", tail="ValueError: bad input", exit_code=1), _record(0, "h0"),
                _record(1, "h0"), _record(3, "h1")])
    assert find_loss(end, _plan()) is None


def test_a_timeout_naming_no_one_in_particular_loses_no_one():
    tail = TIMEOUT.replace("waiting for rank 3", "waiting for one or more of ranks 1, 2, 3")
    end = _end([_record(0, "h0", "failed", tail=tail, exit_code=1), _record(1, "h0"), _record(2, "h1"),
                _record(3, "h1")])
    assert find_loss(end, _plan()) is None


def test_ranks_on_this_host_only_shrink_in_number():
    plan = _plan(hosts=(), nranks=3)
    end = _end([_record(2, "vm", "failed", signal=9, exit_code=137), _record(0, "vm"), _record(1, "vm")],
               hosts=("vm", "vm", "vm"))
    assert survivors(plan, end, find_loss(end, plan)) == [("vm", 2)]


def test_a_rank_that_timed_out_itself_is_no_loss_though_a_peer_waited_for_it():
    # Rank 1 waited for the hung rank 2, rank 0 for rank 1 (a cascade); only rank 2 is lost.
    plan = _plan(hosts=(("h0", 1), ("h1", 1), ("h2", 1)))
    for cause in ("failed", "stopped"):   # rank 1 may have been ended by the MPI as it raised
        end = _end([_record(1, "h1", cause, tail=TIMEOUT.replace("rank 3", "rank 2"), exit_code=1),
                    _record(0, "h0", "failed", tail=TIMEOUT.replace("rank 3", "rank 1"), exit_code=1),
                    _record(2, "h2")], hosts=("h0", "h1", "h2"))
        assert list(find_loss(end, plan).ranks) == [2], cause


def test_a_silent_host_that_can_start_a_rank_is_not_lost():
    # Nothing came from h1 (the MPI ended the job before its records), but a rank starts there: only the rank
    # the others waited for is lost.
    end = _end([_record(0, "h0", "failed", tail=TIMEOUT.replace("rank 3", "rank 2"), exit_code=1),
                _record(1, "h0")])
    loss = find_loss(end, _plan(), probe=lambda hosts: (set(hosts), []))
    assert list(loss.ranks) == [2] and not loss.silent_hosts
    assert survivors(_plan(), end, loss) == [("h0", 2), ("h1", 1)]


def test_a_host_whose_daemon_the_mpi_lost_first_is_found_by_the_probe():
    # The MPI ended the job on losing h1's daemon before any rank timed out: no rank failed, nothing came
    # from h1, and no rank can be started there.
    end = _end([_record(0, "h0"), _record(1, "h0")])
    loss = find_loss(end, _plan(), probe=lambda hosts: (set(), []))
    assert sorted(loss.ranks) == [2, 3] and loss.silent_hosts == {1}
    assert find_loss(end, _plan(), probe=lambda hosts: (set(hosts), [])) is None


def test_records_the_stream_lost_are_read_where_the_ranks_kept_them():
    # Only rank 0's record arrived (it timed out waiting for rank 1); the ranks of h1 and h2 kept theirs:
    # rank 1 timed out itself, waiting for rank 2, which had been stopped. Only rank 2 is lost.
    plan = _plan(hosts=(("h0", 1), ("h1", 1), ("h2", 1)))
    end = _end([_record(0, "h0", "failed", tail=TIMEOUT.replace("rank 3", "rank 1"), exit_code=1)],
               hosts=("h0", "h1", "h2"))
    kept = [_record(1, "h1", "stopped", tail=TIMEOUT.replace("rank 3", "rank 2"), exit_code=1),
            _record(2, "h2", stopped_for=9.7)]
    loss = find_loss(end, plan, probe=lambda hosts: (set(hosts), kept))
    assert list(loss.ranks) == [2] and "SIGSTOP" in loss.ranks[2]


def test_a_rank_named_by_a_timeout_is_no_loss_when_another_was_found_stopped():
    # Rank 0 timed out waiting for rank 1, which waited for the stopped rank 2 but was ended before it timed out.
    plan = _plan(hosts=(("h0", 1), ("h1", 1), ("h2", 1)))
    end = _end([_record(0, "h0", "failed", tail=TIMEOUT.replace("rank 3", "rank 1"), exit_code=1),
                _record(1, "h1"), _record(2, "h2", stopped_for=9.3)], hosts=("h0", "h1", "h2"))
    assert list(find_loss(end, plan).ranks) == [2]


def test_a_rank_the_mpi_aborted_on_finding_a_peer_gone_is_no_loss():
    # Rank 1 of h1 is killed; rank 2 (on h2) finds its sockets closed, and Open MPI's TCP transport aborts it
    # (exit 14) before the engine sees anything: only rank 1 is lost.
    plan = _plan(hosts=(("h0", 1), ("h1", 1), ("h2", 1), ("h3", 1)))
    aborted = ("[h2:00000] *** An error occurred in Socket closed\n[h2:00000] *** on a NULL communicator\n"
               "[h2:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,")
    end = _end([_record(1, "h1", "failed", signal=9, exit_code=137),
                _record(2, "h2", "failed", tail=aborted, exit_code=14), _record(0, "h0"), _record(3, "h3")],
               hosts=("h0", "h1", "h2", "h3"))
    loss = find_loss(end, plan)
    assert list(loss.ranks) == [1], loss
    assert survivors(plan, end, loss) == [("h0", 1), ("h2", 1), ("h3", 1)]
    # The MPI then ends the job: the other ranks exit with the same code and no message of their own.
    silent = _end([_record(1, "h1", "failed", signal=9, exit_code=137), _record(2, "h2", "failed", tail=aborted,
                                                                              exit_code=14),
                   _record(0, "h0", "failed", tail="I0000 oneDNN custom operations are on.", exit_code=14),
                   _record(3, "h3", "failed", exit_code=14)], hosts=("h0", "h1", "h2", "h3"))
    assert list(find_loss(silent, plan).ranks) == [1]
    # One that fails of its own beside the loss still ends the job: its error is the user's.
    own = _end([_record(1, "h1", "failed", signal=9, exit_code=137),
                _record(0, "h0", "failed", tail="Traceback ...\nValueError: bad input", exit_code=1)],
               hosts=("h0", "h1", "h2", "h3"))
    assert find_loss(own, plan) is None
