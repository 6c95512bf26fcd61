"""Errors, not hangs: run with TNT_TIMEOUT_SECONDS=3 on 2+ ranks.

Each check prints "OK <name>" on every rank; the last one (a timeout) ends the
job through rank 0 with exit code 7 after printing what it was told.
"""
import os
import sys
import time

import numpy as np

import tarantella as tnt
from expect_error import expect  # beside this program
from tarantella import _engine

rank, size = tnt.get_rank(), tnt.get_size()
last = size - 1


# Ranks disagree on the element count: every rank raises, naming each rank's call.
count = 10 if rank == 0 else 11
for algorithm in ("shared_memory", "ring", "recursive_doubling", "rabenseifner", "mpi"):
    expect(tnt.MismatchError, f"count mismatch via {algorithm}",
           lambda: tnt.allreduce(np.ones(count, np.float32), algorithm=algorithm),
           "rank 0 had float32[10]", f"rank {last} had float32[11]")
# ... and the collectives still work afterwards.
assert tnt.allreduce(np.ones(4), algorithm="shared_memory").tolist() == [size] * 4
print("OK usable after mismatch", flush=True)

dtype = np.float32 if rank == 0 else np.float64
expect(tnt.MismatchError, "dtype mismatch", lambda: tnt.allreduce(np.ones(8, dtype), algorithm="ring"),
       "float32[8]", "float64[8]")
op = "sum" if rank == 0 else "max"
expect(tnt.MismatchError, "op mismatch", lambda: tnt.allreduce(np.ones(8), op=op), "float64[8] sum", "float64[8] max")

# Different gradient layouts: every rank refuses to build the reducer.
tensors = [(10, "float32")] * (3 if rank == 0 else 4)
expect(tnt.MismatchError, "reducer layout mismatch",
       lambda: _engine.Reducer(tensors, 1024, "sum", "auto", tnt.Group.world()._handle),
       "rank 0 has 3 tensors", f"rank {last} has 4 tensors")

# A tensor never marked ready: wait names it instead of hanging.
reducer = _engine.Reducer([(10, "float32"), (10, "float32")], 1 << 20, "sum", "auto", tnt.Group.world()._handle)
reducer.ready(0, np.ones(10, np.float32))
expect(tnt.CollectiveTimeoutError, "wait for a tensor never marked ready",
       lambda: reducer.wait(0, np.empty(10, np.float32)), "waiting for tensor(s) 1 of this rank")
expect(ValueError, "tensor marked ready twice", lambda: reducer.ready(0, np.ones(10, np.float32)),
       "marked ready twice")
reducer.close()
tnt.barrier()

# An idle rank does not burn a core: rank 0 waits 1.5 s in an allreduce for the last rank.
if rank == last:
    time.sleep(1.5)
cpu_before, wall_before = time.process_time(), time.monotonic()
tnt.allreduce(np.ones(1000, np.float32))
cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
if rank == 0:
    print(f"IDLE cpu={cpu:.3f}s wall={wall:.3f}s", flush=True)

# The last rank never joins: the others raise a timeout naming it.
if rank == last:
    time.sleep(30)
    sys.exit(0)
try:
    tnt.allreduce(np.ones(1000, np.float32))
except tnt.CollectiveTimeoutError as error:
    print(f"TIMEOUT {error}", flush=True)
    if rank == 0:
        os._exit(7)
    time.sleep(30)
raise AssertionError("no timeout")
