"""Special values, closing, and a failed group: run on 2 ranks with TNT_TIMEOUT_SECONDS=3.

Prints "OK <name>" per check on the ranks that make it. In order:
 1. min/max with NaN (several payloads), -0 and +0 give the same bits on every
    rank for every algorithm and dtype, equal to the total-order result
    (Note [Min and max of floating point]).
 2. Garbage collection of a reducer on one rank only starts no collective: the
    ranks go on with other collectives (Note [Closing is explicit]).
 3. Closing: a closed sub-group refuses calls; closing a reducer fails a
    blocking wait in another thread and a pending C-API delivery (what a
    TensorFlow FinishAllreduce waits on), which never hangs.
 4. A failed group (Note [A failed group stays failed]): rank 1 arrives late
    to an allreduce; rank 0 times out, then every later call of rank 0 raises
    GroupFailedError at once (all collectives, sub-groups, reducers), and the
    arrays of the failed call stay alive after Python dropped them (MPI may
    still write into them). Rank 1's late call is never answered, so it times
    out and is refused alike. Both ranks then leave normally; the engine does
    not finalise MPI after a failure.
"""
import ctypes
import gc
import os
import sys
import threading
import time
import weakref

import numpy as np

import tarantella as tnt
from tarantella import _engine
from tarantella.errors import GroupFailedError

try:
    import ml_dtypes
    BFLOAT16 = ml_dtypes.bfloat16
except ImportError:
    BFLOAT16 = None

rank, size = tnt.get_rank(), tnt.get_size()
assert size == 2, "run this program on 2 ranks"
world = tnt.Group.world()
ALGORITHMS = ["auto", "ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical", "mpi"]


def ok(name):
    print(f"OK {name}", flush=True)


# 1. min/max with NaN and signed zeros --------------------------------------------------------------
def total_order_pick(a, b, op, dtype):
    """Reference for one pair, on the raw bits: NaN propagates, larger NaN bits win, -0 < +0."""
    udtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    fa, fb = np.array([a], dtype)[0].astype(np.float64), np.array([b], dtype)[0].astype(np.float64)
    ba, bb = int(np.array([a], dtype).view(udtype)[0]), int(np.array([b], dtype).view(udtype)[0])
    if np.isnan(fa) or np.isnan(fb):
        if np.isnan(fa) and np.isnan(fb):
            return a if ba >= bb else b
        return a if np.isnan(fa) else b
    if fa == fb:
        negative_first = np.signbit(fa)
        if op == "min":
            return a if negative_first else b
        return b if negative_first else a
    return (a if fa < fb else b) if op == "min" else (a if fa > fb else b)


def special_values(dtype, r):
    """Per element, one of: NaN payloads, -0, +0, numbers; rank r gets a rotation of them."""
    udtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    nan = np.array([np.nan], dtype).view(udtype)[0]
    nans = np.array([nan, nan | 1, nan | 3, nan | (udtype(1) << udtype(np.dtype(dtype).itemsize * 8 - 1))],
                    udtype).view(dtype)
    pool = list(nans) + [np.array(v, dtype) for v in (-0.0, 0.0, 1.0, -1.0, np.inf, -np.inf)]
    values = [pool[(i * 7 + r * 3) % len(pool)] if (i + r) % 5 else pool[(i + r) % len(pool)]
              for i in range(40)]
    return np.array(values, dtype)


dtypes = [np.float32, np.float64, np.float16] + ([BFLOAT16] if BFLOAT16 else [])
for dtype in dtypes:
    udtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    mine = special_values(dtype, rank)
    for op in ("min", "max"):
        theirs = [special_values(dtype, r) for r in range(size)]
        want = np.array([total_order_pick(theirs[0][i], theirs[1][i], op, dtype) for i in range(len(mine))], dtype)
        for algorithm in ALGORITHMS:
            got = tnt.allreduce(mine, op=op, algorithm=algorithm)
            digests = tnt.allgather_object(got.view(udtype).tobytes())
            assert len(set(digests)) == 1, f"{algorithm} {op} {np.dtype(dtype).name}: ranks differ"
            # Narrow types quiet a signalling NaN when they widen (same bits on all ranks).
            if np.dtype(dtype).itemsize > 2:
                assert np.array_equal(got.view(udtype), want.view(udtype)), \
                    f"{algorithm} {op} {np.dtype(dtype).name}: {got.view(udtype)} != {want.view(udtype)}"
            else:
                assert np.array_equal(np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32)))
                same = ~np.isnan(want.astype(np.float32))
                assert np.array_equal(got.view(udtype)[same], want.view(udtype)[same]), f"{algorithm} {op}"
ok("min max NaN and signed zeros bitwise")

# 2. A reducer garbage-collected on one rank only ------------------------------------------------------
tensors = [(1000, "float32")]
reducer = _engine.Reducer(tensors, 1 << 20, "sum", "shared_memory", world._handle)
reducer.ready(0, np.ones(1000, np.float32))
out = np.empty(1000, np.float32)
reducer.wait(0, out)
assert out[0] == size
if rank == 0:
    del reducer
    gc.collect()
for _ in range(3):
    assert tnt.allreduce(np.ones(8), algorithm="shared_memory")[0] == size
tnt.barrier()
if rank == 1:
    del reducer
    gc.collect()
tnt.barrier()
ok("reducer collected on one rank starts no collective")

# 3. Closing ---------------------------------------------------------------------------------------
sub = world.split(0)
assert tnt.allreduce(np.ones(3), group=sub)[0] == size
sub._handle.close()
try:
    tnt.allreduce(np.ones(3), group=sub)
    raise AssertionError("a closed group ran an allreduce")
except ValueError as error:
    assert "closed" in str(error), error
try:
    world._handle.close()
    raise AssertionError("the world group closed")
except ValueError as error:
    assert "at exit" in str(error), error
ok("closed group refuses")

# A blocking wait in another thread, for a bucket that never completes, fails when the reducer closes.
reducer = _engine.Reducer([(10, "float32"), (10, "float32")], 1 << 20, "sum", "auto", world._handle)
reducer.ready(0, np.ones(10, np.float32))
outcome = []


def wait_for_result():
    try:
        reducer.wait(0, np.empty(10, np.float32))
        outcome.append("returned")
    except ValueError as error:
        outcome.append(str(error))


waiter = threading.Thread(target=wait_for_result)
waiter.start()
time.sleep(0.3)
started = time.monotonic()
reducer.close()
waiter.join(5)
assert not waiter.is_alive() and outcome and "closed" in outcome[0], outcome
assert time.monotonic() - started < 2
ok("close fails a blocking wait")

# A pending delivery through the C API (TensorFlow's FinishAllreduce) fails when the reducer is collected.
engine_library = ctypes.CDLL(os.path.join(os.path.dirname(_engine.__file__), "libtnt_engine.so"))
DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
delivered = []
done = DONE(lambda context, error: delivered.append(None if error is None else error.decode()))
reducer = _engine.Reducer([(10, "float32"), (10, "float32")], 1 << 20, "sum", "auto", world._handle)
result = np.empty(10, np.float32)
error_text = ctypes.create_string_buffer(1024)
engine_library.tnt_reducer_deliver.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                               DONE, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
rc = engine_library.tnt_reducer_deliver(reducer.id, 0, result.ctypes.data, result.nbytes, done, None, error_text,
                                        1024)
assert rc == 0, error_text.value
time.sleep(0.2)
assert delivered == [], delivered
del reducer
gc.collect()
deadline = time.monotonic() + 5
while not delivered and time.monotonic() < deadline:
    time.sleep(0.05)
assert delivered and delivered[0] and "destroyed" in delivered[0], delivered
ok("pending delivery fails when the reducer goes")
tnt.barrier()

# 4. A failed group --------------------------------------------------------------------------------
stage = world.split(0)
standing = _engine.Reducer([(10, "float32")], 1 << 20, "sum", "auto", world._handle)
count = 1 << 20
data = np.full(count, rank + 1, np.float32)


DONE_MARKER = os.path.join("/tmp", f"tnt-group-failure-{os.environ.get('PMIX_NAMESPACE', 'job')}-done")


def refused(name, call):
    started = time.monotonic()
    try:
        call()
    except GroupFailedError as error:
        took = time.monotonic() - started
        assert took < 0.5, f"{name}: refused only after {took:.2f} s"
        assert "\n" not in str(error) and "earlier collective" in str(error), error
        return
    raise AssertionError(f"{name}: ran on a failed group")


def check_refusals(tag):
    assert world._handle.failed and stage._handle.failed
    for algorithm in ALGORITHMS:
        refused(f"allreduce {algorithm}", lambda: tnt.allreduce(np.ones(4), algorithm=algorithm))
    refused("broadcast", lambda: tnt.broadcast(np.ones(4)))
    refused("allgather", lambda: tnt.allgather(np.ones(4)))
    refused("allgather_object", lambda: tnt.allgather_object(1))
    refused("barrier", tnt.barrier)
    refused("sub-group allreduce", lambda: tnt.allreduce(np.ones(4), group=stage))
    refused("split", lambda: world.split(0))
    refused("reducer ready", lambda: standing.ready(0, np.ones(10, np.float32)))
    refused("new reducer", lambda: _engine.Reducer([(4, "float32")], 0, "sum", "auto", world._handle))
    ok(f"refused at once {tag}")


if rank == 0:
    out = np.zeros(count, np.float32)
    watch = weakref.ref(out)
    try:
        tnt.allreduce(data, algorithm="mpi", out=out)
        raise AssertionError("no timeout")
    except tnt.CollectiveTimeoutError as error:
        print(f"TIMEOUT {error}", flush=True)
    check_refusals("after a timeout")
    del out
    gc.collect()
    assert watch() is not None, "the failed call's output array was freed while MPI may still write into it"
    ok("failed call's buffers kept")
    # Leaving without MPI_Finalize ends the job: first let rank 1 finish its checks.
    deadline = time.monotonic() + 30
    while not os.path.exists(DONE_MARKER) and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.path.exists(DONE_MARKER):
        os.remove(DONE_MARKER)
else:
    time.sleep(4.5)  # rank 0 times out after 3 s and refuses everything from then on
    try:
        tnt.allreduce(data, algorithm="mpi")
        raise AssertionError("no timeout")
    except tnt.CollectiveTimeoutError as error:
        print(f"TIMEOUT {error}", flush=True)
    check_refusals("after a timeout")
    open(DONE_MARKER, "w").close()
print("LEAVING", flush=True)
sys.exit(0)
