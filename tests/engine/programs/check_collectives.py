"""Checks every engine collective on however many ranks run it.

Every algorithm x dtype x op x length (0, 1, p-1, p+1, a prime, 64 MiB), and
the flat algorithms at lengths around an exchange's piece, are compared with
numpy, results are checked bitwise identical on all ranks and across two runs,
then broadcast, allgather, object collectives, sub-groups and
the fused reducer (tensors marked ready in a different order on every rank).
Prints "CHECKED <n>" on success; any failure raises (and ends the job).
"""
import functools
import hashlib
import sys

import numpy as np

import tarantella as tnt
from tarantella import _engine as tnt_engine
import exact_inputs  # beside this program
from exact_inputs import contribution

try:
    import ml_dtypes
    BFLOAT16 = ml_dtypes.bfloat16
except ImportError:  # TensorFlow brings ml_dtypes; the engine does not need it
    BFLOAT16 = None

rank, size = tnt.get_rank(), tnt.get_size()
checks = 0
ALGORITHMS = ["auto", "ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical", "mpi"]
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64] + ([BFLOAT16] if BFLOAT16 else [])
BIG = (64 << 20) // 4  # 64 MiB of float32


@functools.lru_cache(maxsize=None)
def expected(length, dtype, op):
    return exact_inputs.expected(length, dtype, op, size)


def same_on_all_ranks(array, what):
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    digests = tnt.allgather_object(digest)
    assert len(set(digests)) == 1, f"{what}: results differ between ranks: {digests}"


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(f"rank {rank}: {what}")
    checks += 1


lengths = sorted({0, 1, max(size - 1, 0), size + 1, 1009})
for algorithm in ALGORITHMS:
    for dtype in DTYPES:
        for op in ("sum", "average", "min", "max"):
            for length in lengths:
                mine = contribution(length, dtype, rank)
                got = tnt.allreduce(mine, op=op, algorithm=algorithm)
                want = expected(length, dtype, op)
                check(got.dtype == want.dtype and got.shape == want.shape, f"{algorithm} {dtype} {op} {length}: shape")
                check(np.array_equal(got.astype(np.float64), want.astype(np.float64)),
                      f"{algorithm} {np.dtype(dtype).name} {op} len={length}: got {got[:6]} want {want[:6]}")
# Messages just below, at and above an exchange's piece (Note [Messages in pieces]
# in csrc/engine/exchange.hpp): whole-vector steps (recursive doubling, Rabenseifner
# on 2 ranks) and half-vector ones (Rabenseifner's first step on 4) meet each boundary.
PIECE_BYTES = tnt_engine.exchange_piece_bytes
for dtype in (np.float32, np.float64, np.float16):
    per_piece = PIECE_BYTES // np.dtype(dtype).itemsize
    for length in sorted({per_piece - 1, per_piece, per_piece + 1, 2 * per_piece, 2 * per_piece + 1,
                          4 * per_piece + 3}):
        mine = contribution(length, dtype, rank)
        want = expected(length, dtype, "sum")
        for algorithm in ("ring", "recursive_doubling", "rabenseifner", "auto"):
            got = tnt.allreduce(mine, algorithm=algorithm)
            check(np.array_equal(got.astype(np.float64), want.astype(np.float64)),
                  f"{algorithm} {np.dtype(dtype).name} len={length} (pieces of {PIECE_BYTES} bytes)")
    expected.cache_clear()
# 64 MiB for every dtype and algorithm (sum, in place); buffers are reused to
# keep page faults out of the run time.
for dtype in DTYPES:
    length = BIG * 4 // np.dtype(dtype).itemsize
    base = contribution(length, dtype, rank)
    want = expected(length, dtype, "sum")
    buffer = np.empty_like(base)
    for algorithm in ALGORITHMS:
        np.copyto(buffer, base)
        tnt.allreduce(buffer, op="sum", algorithm=algorithm, out=buffer)
        check(np.array_equal(buffer, want), f"{algorithm} {np.dtype(dtype).name} 64 MiB in place")
    del base, want, buffer
    expected.cache_clear()

# Random floats: bitwise identical on all ranks, and across two runs.
generator = np.random.default_rng(1234 + rank)
for algorithm in ALGORITHMS:
    for length in (1, 4099, 3 << 20):
        data = generator.standard_normal(length).astype(np.float32)
        first = tnt.allreduce(data, algorithm=algorithm)
        second = tnt.allreduce(data, algorithm=algorithm)
        check(np.array_equal(first, second), f"{algorithm} len={length}: two runs differ")
        same_on_all_ranks(first, f"{algorithm} len={length}")
        every = tnt.allgather(data)
        check(np.allclose(first, every.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5),
              f"{algorithm} len={length}: random sum off")

# Half types with rounding, over the whole range (subnormals to overflow): with
# two ranks every algorithm computes round(a + b), which numpy computes too.
if size == 2:
    for dtype in [np.float16] + ([BFLOAT16] if BFLOAT16 else []):
        magnitudes = 10.0 ** generator.uniform(-9, 5 if dtype is np.float16 else 30, 20000)
        data = (generator.standard_normal(20000) * magnitudes).astype(dtype)
        every = tnt.allgather(data)
        want = (every[0] + every[1]).astype(dtype)
        for algorithm in ALGORITHMS:
            got = tnt.allreduce(data, algorithm=algorithm)
            check(np.array_equal(got, want, equal_nan=True),
                  f"{algorithm} {np.dtype(dtype).name}: rounding differs from numpy at "
                  f"{np.flatnonzero(got.astype(np.float64) != want.astype(np.float64))[:5]}")

# Broadcast, allgather, objects.
for root in range(size):
    payload = np.full(17, rank, dtype=np.int64)
    tnt.broadcast(payload, root=root)
    check(np.all(payload == root), f"broadcast from {root}")
gathered = tnt.allgather(np.array([rank, rank * rank], dtype=np.int32))
check(gathered.tolist() == [[r, r * r] for r in range(size)], "allgather")
check(tnt.allgather_object({"rank": rank, "text": "x" * rank}) == [{"rank": r, "text": "x" * r} for r in range(size)],
      "allgather_object")
check(tnt.broadcast_object(("hello", rank), root=size - 1) == ("hello", size - 1), "broadcast_object")
tnt.barrier()

# Sub-groups: even and odd ranks reduce separately.
world = tnt.Group.world()
halves = world.split(rank % 2)
members = [r for r in range(size) if r % 2 == rank % 2]
check(halves.size == len(members) and halves.world_rank_of(halves.rank) == rank, "split group shape")
for algorithm in ALGORITHMS:
    got = tnt.allreduce(np.array([rank + 1.0] * 5), algorithm=algorithm, group=halves)
    check(np.all(got == sum(r + 1.0 for r in members)), f"sub-group allreduce via {algorithm}")

# The fused reducer: buckets at several thresholds, tensors marked ready in a
# different (random) order on every rank, several steps.
from tarantella import _engine  # noqa: E402

shapes = [(300,), (5, 7), (1,), (4096,), (33,), (2, 2, 2), (10000,), (3,)]
for threshold in (0, 64, 4096, 32 * 1024, 1 << 30):
    for op in ("sum", "average"):
        reducer = _engine.Reducer([(int(np.prod(s)), "float32") for s in shapes], threshold, op, "auto",
                                  world._handle)
        order = np.random.default_rng(rank * 31 + threshold).permutation(len(shapes))
        for step in range(3):
            inputs = [np.full(s, (rank + 1) * (step + 1) + i, dtype=np.float32) for i, s in enumerate(shapes)]
            for tensor in order:
                reducer.ready(int(tensor), inputs[tensor])
            for tensor in order[::-1]:
                out = np.empty(shapes[tensor], dtype=np.float32)
                reducer.wait(int(tensor), out)
                total = sum((r + 1) * (step + 1) + tensor for r in range(size))
                want = total / size if op == "average" else total
                check(np.allclose(out, want, rtol=0, atol=0), f"reducer t={threshold} {op} step {step} tensor {tensor}")
        buckets = reducer.bucket_count
        if threshold == 0:
            check(buckets == len(shapes), "threshold 0 gives one bucket per tensor")
        if threshold == 1 << 30:
            check(buckets == 1, "a huge threshold gives one bucket")
        reducer.close()

print(f"CHECKED {checks}", flush=True)
sys.stdout.flush()
