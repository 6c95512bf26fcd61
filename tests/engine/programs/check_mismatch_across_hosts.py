"""Ranks that call an allreduce differently across hosts (a namespace cluster) get a
clear MismatchError, promptly, never a hang or a silent wrong result
(Note [Checking calls alongside the data] in csrc/engine/allreduce_call_check.hpp).

    check_mismatch_across_hosts.py count DIR       (2 or 3 hosts x 1 rank, or 2 hosts x 2 ranks)
    check_mismatch_across_hosts.py algorithm DIR   (2 x 2 or 4 x 1: partners that never send)

Run with a timeout (TNT_TIMEOUT_SECONDS) longer than the test's own: a mismatch
found only by timing out fails the test. Prints "OK <name>" per check, then
LEAVING; the group has failed by then, so the engine does not finalise MPI and
the job ends non-zero. Ranks leave together, meeting through files in DIR (no
collective works any more): a rank that left early would close its sockets
under a slower rank, which MPI reports as a fatal error of that rank.
"""
import os
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella import _engine as tnt_engine
from expect_error import expect  # beside this program
from tarantella.errors import GroupFailedError

rank, size = tnt.get_rank(), tnt.get_size()
world = tnt.Group.world()._handle
last = size - 1
mode, meeting = sys.argv[1], sys.argv[2]
assert not world.on_one_node, "run this program on several hosts"


def ok(name):
    print(f"OK {name}", flush=True)


# float32 elements in one piece of an exchange's message (Note [Messages in pieces] in
# csrc/engine/exchange.hpp).
PER_PIECE = tnt_engine.exchange_piece_bytes // 4


def calls_alike():
    # Lengths around a piece's size: whole-vector and half-vector steps meet each boundary.
    for length in (1000, PER_PIECE - 1, PER_PIECE, PER_PIECE + 1, 2 * PER_PIECE + 1, 4 * PER_PIECE + 3):
        for algorithm in ("auto", "hierarchical", "ring", "recursive_doubling", "rabenseifner", "mpi"):
            got = tnt.allreduce(np.arange(length, dtype=np.float32) % 7 + rank + 1, algorithm=algorithm)
            want = (np.arange(length, dtype=np.float32) % 7) * size + size * (size + 1) / 2
            assert np.array_equal(got, want), (algorithm, length, got[:4])
    ok("calls alike are right")


if mode == "algorithm":
    calls_alike()
    # The last rank runs the ring, the others Rabenseifner: some ranks wait for partners that
    # never send. The check, polled by those waits, ends them (TNT_TIMEOUT_SECONDS is far off).
    algorithm = "ring" if rank == last else "rabenseifner"
    expect(tnt.MismatchError, "algorithm mismatch alongside the data",
           lambda: tnt.allreduce(np.ones(1 << 16, np.float32), algorithm=algorithm),
           "rank 0 had float32[65536] sum via rabenseifner", f"rank {last} had float32[65536] sum via ring",
           "unusable")
elif world.equal_ranks_per_node and world.local_size > 1:
    # The first hierarchical call of a group checks before any data moves (making the
    # hierarchical allreduce is collective): a mismatch there leaves the group usable.
    count = 11 if rank == last else 10
    expect(tnt.MismatchError, "count mismatch before the first hierarchical call",
           lambda: tnt.allreduce(np.ones(count, np.float32), algorithm="hierarchical"),
           "rank 0 had float32[10] sum via hierarchical", f"rank {last} had float32[11] sum via hierarchical")
    assert tnt.allreduce(np.ones(4), algorithm="hierarchical").tolist() == [size] * 4
    assert not world.failed
    ok("usable after a mismatch found before the data moved")
    calls_alike()
    # Later ones check alongside the data: the last rank asks for another count (its
    # node's shared-memory round sees it first, the other node only through the check).
    expect(tnt.MismatchError, "count mismatch alongside hierarchical data",
           lambda: tnt.allreduce(np.ones(count * 1000, np.float32), algorithm="hierarchical"),
           "rank 0 had float32[10000] sum via hierarchical",
           f"rank {last} had float32[11000] sum via hierarchical", "unusable")
else:
    calls_alike()
    count = 11 if rank == last else 10
    # MPI's own allreduce is checked before its data moves (its messages could truncate).
    expect(tnt.MismatchError, "count mismatch before MPI's allreduce",
           lambda: tnt.allreduce(np.ones(count * 1000, np.float32), algorithm="mpi"),
           "rank 0 had float32[10000] sum via mpi", f"rank {last} had float32[11000] sum via mpi")
    assert not world.failed
    # One rank per host: the last rank's message is one element longer than the others'
    # receive, and takes a second piece (Note [A receive never truncates], Note [Messages
    # in pieces]).
    longer = PER_PIECE + (1 if rank == last else 0)
    expect(tnt.MismatchError, "count mismatch alongside the data",
           lambda: tnt.allreduce(np.ones(longer, np.float32)),
           f"rank 0 had float32[{PER_PIECE}] sum via auto", f"rank {last} had float32[{PER_PIECE + 1}] sum via auto",
           "unusable")

# After a mismatch found while data moved the group has failed: every later call refuses at once,
# naming the mismatch (the launcher's timeout of the test would catch a hang).
assert world.failed
# (The first failure on this rank: the call check's message, or a message of the wrong size
# that this rank refused to receive, Note [A receive never truncates].)
expect(GroupFailedError, "refused after the mismatch", lambda: tnt.allreduce(np.ones(4)), "differently")
open(os.path.join(meeting, f"rank{rank}"), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(meeting)) < size and time.monotonic() < deadline:
    time.sleep(0.05)
print("LEAVING", flush=True)
