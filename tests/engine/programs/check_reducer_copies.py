"""The fused reducer's data path on one node (Note [Two copies per gradient byte] in
csrc/engine/fused_reducer.hpp), on however many ranks run it:
- buckets live in shared segments at more than one rank (private buffers at one rank, or with an
  algorithm other than shared_memory/auto);
- each step copies every byte exactly twice (ready + result) with shared buckets, and the results are
  bitwise numpy's rank-order sums, for float32/float64/float16/int32 tensors of many sizes, average too;
- ranks mark tensors ready in different orders, and a rank that collects its results late holds back
  its peers' next step (the CONSUMED flag) without a wrong result.
Prints "CHECKED <n> COPIES_PER_BYTE <x>"; any failure raises (and ends the job).
"""
import time

import numpy as np

import tarantella as tnt
from tarantella import _engine

rank, size = tnt.get_rank(), tnt.get_size()
handle = tnt.Group.world()._handle
checks = 0


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        raise AssertionError(f"rank {rank}: {what}")


SHAPES = [((300,), np.float32), ((5, 7), np.float32), ((1,), np.float32), ((70000,), np.float32),
          ((33,), np.float64), ((2, 2, 3), np.float16), ((10007,), np.int32), ((3,), np.float32), ((0,), np.float32)]


def inputs_of(r, step):
    rng = np.random.default_rng(1000 * step + r)
    made = []
    for shape, dtype in SHAPES:
        if np.issubdtype(dtype, np.integer):
            made.append(rng.integers(-1000, 1000, size=shape).astype(dtype))
        else:
            made.append(rng.standard_normal(shape).astype(dtype))
    return made


def rank_order_sum(step, index, op):
    parts = [inputs_of(r, step)[index] for r in range(size)]
    dtype = parts[0].dtype
    if dtype == np.float16:  # the engine widens to float32, rounds the sum, then divides and rounds again
        acc = parts[0].astype(np.float32)
        for part in parts[1:]:
            acc = acc + part.astype(np.float32)
        acc = acc.astype(np.float16)
        return (acc.astype(np.float32) / size).astype(np.float16) if op == "average" else acc
    acc = parts[0].copy()
    for part in parts[1:]:
        acc = acc + part
    if op == "average":
        acc = (acc // size if np.issubdtype(dtype, np.integer) else acc / dtype.type(size)).astype(dtype)
    return acc


total_bytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in SHAPES)
copies_per_byte = []
for algorithm, threshold, op in [("auto", 32 * 1024, "sum"), ("auto", 0, "average"), ("auto", 1 << 30, "sum"),
                                 ("ring", 32 * 1024, "sum")]:
    if op == "average" and any(np.issubdtype(d, np.integer) for _, d in SHAPES):
        specs = [(int(np.prod(s)), np.dtype(d).name) for s, d in SHAPES if not np.issubdtype(d, np.integer)]
        kept = [i for i, (_, d) in enumerate(SHAPES) if not np.issubdtype(d, np.integer)]
    else:
        specs = [(int(np.prod(s)), np.dtype(d).name) for s, d in SHAPES]
        kept = list(range(len(SHAPES)))
    reducer = _engine.Reducer(specs, threshold, op, algorithm, handle)
    shared = reducer.buckets_in_shared_memory
    check(shared == (size > 1 and algorithm == "auto"), f"{algorithm}: buckets in shared memory is {shared}")
    order = np.random.default_rng(rank * 7 + threshold).permutation(len(kept))
    for step in range(4):
        inputs = inputs_of(rank, step)
        before = _engine.copied_bytes()
        for position in order:
            reducer.ready(int(position), inputs[kept[position]])
        if step == 2 and rank == 0:
            time.sleep(1.0)  # peers reach step 3 first and must wait for this rank's collection
        outs = {}
        for position in order[::-1]:
            shape, dtype = SHAPES[kept[position]]
            out = np.empty(shape, dtype=dtype)
            reducer.wait(int(position), out)
            outs[position] = out
        step_bytes = sum(inputs[i].nbytes for i in kept)
        copies_per_byte.append((algorithm, (_engine.copied_bytes() - before) / step_bytes))
        for position, out in outs.items():
            want = rank_order_sum(step, kept[position], op)
            if shared:  # rank-order sums, bit for bit
                same = out.dtype == want.dtype and np.array_equal(out.view(np.uint8), want.view(np.uint8))
            else:  # the ring sums each chunk in its own order
                same = np.allclose(out, want, rtol=1e-2 if out.dtype == np.float16 else 1e-5, atol=1e-2)
            check(same, f"{algorithm} t={threshold} {op} step {step} tensor {kept[position]}: "
                        f"{out.ravel()[:4]} vs {want.ravel()[:4]}")
    check(reducer.reductions_completed == 4 * reducer.bucket_count, "every bucket reduced once per step")
    reducer.close()

shared_copies = {c for a, c in copies_per_byte if a == "auto"}
check(shared_copies == {2.0}, f"shared buckets copy each byte twice per step: {copies_per_byte}")
print(f"CHECKED {checks} COPIES_PER_BYTE {sorted(shared_copies)}", flush=True)
