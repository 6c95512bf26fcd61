"""Allreduce across hosts (a namespace cluster): every algorithm, the hierarchical
one included, against numpy; bitwise equal on all ranks and across runs.

    check_hierarchical.py hierarchical|flat [LINK_DEVICES COUNTERS_PID]
        (what `auto` must pick: 2 x 2 hierarchical, 3 + 1 flat)

Checks the engine's view of the nodes, what `auto` picks (Note [Choosing an
algorithm]), exact results for small integers in every dtype and op (lengths
that leave slices empty, uneven, and a message of several shared-memory rounds),
bitwise agreement for random float32 data (where the summation order matters),
and the fused reducer. Given the root-namespace ends of the hosts' links (and a
process in the root namespace to read their counters through), it also checks
that (with equal ranks per host) the hierarchical allreduce and Rabenseifner
(Note [Rabenseifner's exchange order]) send no more than the bandwidth-optimal 2(H-1)/H x size over each
host's link, plus 10 % for headers (bytes, not times: the load cannot change them).
Prints "CHECKED <n>" when all passed.
"""
import hashlib
import sys

import numpy as np

import tarantella as tnt
import exact_inputs  # beside this program
from exact_inputs import contribution

rank, size = tnt.get_rank(), tnt.get_size()
world = tnt.Group.world()._handle
expected_kind = sys.argv[1]
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(f"rank {rank}: {what}")
    checks += 1


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def same_everywhere(array, what):
    digests = tnt.allgather_object(digest(array))
    check(len(set(digests)) == 1, f"{what}: results differ between ranks")


check(not world.on_one_node and world.node_count >= 2, "the world spans nodes")
check(world.equal_ranks_per_node == (expected_kind == "hierarchical"), "equal ranks per node")
for nbytes in (4 << 10, 1 << 20, 64 << 20):
    flat = "recursive_doubling" if nbytes < 64 << 10 else ("rabenseifner" if size & (size - 1) == 0 else "ring")
    expected_auto = "hierarchical" if expected_kind == "hierarchical" else flat
    check(world.choose_algorithm(nbytes) == expected_auto,
          f"auto picks {world.choose_algorithm(nbytes)} for {nbytes} B, expected {expected_auto}")

ALGORITHMS = ["auto", "hierarchical", "ring", "recursive_doubling", "rabenseifner", "mpi"]
DTYPES = [np.float32, np.float64, np.float16, np.int32]
# 0, fewer elements than ranks per node, uneven slices, a prime, and 3 rounds of 4 MiB slots in float32.
LENGTHS = [0, 1, 3, 1009, 3 * (1 << 20) + 5]


def expected(length, dtype, op):
    return exact_inputs.expected(length, dtype, op, size)


for algorithm in ALGORITHMS:
    for dtype in DTYPES:
        for op in ("sum", "average", "min", "max"):
            for length in LENGTHS:
                if length > 10000 and (op in ("min", "max") or dtype != np.float32):
                    continue  # the many-round case once per algorithm and op kind is enough
                got = tnt.allreduce(contribution(length, dtype, rank), op=op, algorithm=algorithm)
                want = expected(length, dtype, op)
                check(got.dtype == want.dtype and got.shape == want.shape, f"{algorithm} {dtype} {op} {length}")
                check(np.array_equal(got.astype(np.float64), want.astype(np.float64)),
                      f"{algorithm} {np.dtype(dtype).name} {op} len={length}: got {got[:6]} want {want[:6]}")

# Random data: the sum's bits depend on the order, which must be fixed and alike on all ranks.
rng = np.random.default_rng(1234 + rank)
for algorithm in ALGORITHMS:
    for length in (1000, 2 * (1 << 20) + 17):
        data = rng.standard_normal(length).astype(np.float32)
        first = tnt.allreduce(data, algorithm=algorithm)
        second = tnt.allreduce(data, algorithm=algorithm)
        check(np.array_equal(first.view(np.uint32), second.view(np.uint32)), f"{algorithm} {length}: runs differ")
        same_everywhere(first, f"{algorithm} random float32[{length}]")
        reference = np.sum(np.stack(tnt.allgather(data)).astype(np.float64), axis=0)
        check(np.allclose(first, reference, rtol=1e-4, atol=1e-4), f"{algorithm} {length}: wrong sum")

if len(sys.argv) > 2:
    from bench.allreduce.rank_program import LinkCounters
    counters = LinkCounters(sys.argv[2].split(","), int(sys.argv[3]))
    hosts, nbytes = world.node_count, 8 << 20
    data = np.ones(nbytes // 4, np.float32)
    for algorithm in ("hierarchical", "rabenseifner", "ring"):
        sent = counters.per_call(lambda: tnt.allreduce(data, algorithm=algorithm))
        if rank == 0:
            ratio = float(sent.max()) / (2 * (hosts - 1) / hosts * nbytes)
            print(f"LINK {algorithm} {ratio:.3f} x minimum", flush=True)
            # The ring crosses the network on 2 of its 4 hops (1.5 x); with unequal ranks per host no
            # algorithm can reach the minimum on the lone rank's link.
            if algorithm != "ring" and expected_kind == "hierarchical":
                # (not counted by check(): only rank 0 reads the counters)
                assert ratio < 1.10, f"{algorithm} sent {ratio:.2f} x the minimum over a host's link"

# The fused reducer, as training uses it (auto: hierarchical for 2 x 2).
from tarantella import _engine  # noqa: E402
tensors = [(1000, "float32"), (3 * (1 << 20) // 4, "float32"), (17, "float32")]
reducer = _engine.Reducer(tensors, 1 << 20, "sum", "auto", world)
for step in range(2):
    order = list(range(len(tensors)))[::(1 if rank % 2 else -1)]
    inputs = {t: contribution(tensors[t][0], np.float32, rank + step) for t in order}
    for t in order:
        reducer.ready(t, inputs[t])
    for t in range(len(tensors)):
        out = np.empty(tensors[t][0], np.float32)
        reducer.wait(t, out)
        want = sum(contribution(tensors[t][0], np.float64, r + step) for r in range(size)).astype(np.float32)
        check(np.array_equal(out, want), f"reducer step {step} tensor {t}")
check(reducer.reductions_completed == 2 * reducer.bucket_count, "reductions counted")
reducer.close()

print(f"CHECKED {checks}", flush=True)
