"""One-process checks of the engine's Python face (a plain `python` run is a 1-rank job)."""
import time

import numpy as np
import pytest

import tarantella as tnt
from tarantella import _engine

ALGORITHMS = ["auto", "ring", "recursive_doubling", "rabenseifner", "shared_memory", "hierarchical", "mpi"]


def test_plain_python_is_a_one_rank_job():
    assert (tnt.get_rank(), tnt.get_size(), tnt.get_master_rank(), tnt.is_master_rank()) == (0, 1, 0, True)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
def test_one_rank_allreduce_is_a_copy(algorithm, dtype):
    data = (np.arange(37) - 11).astype(dtype).reshape(37, 1)
    for op in ("sum", "average", "min", "max"):
        out = tnt.allreduce(data, op=op, algorithm=algorithm)
        assert out.dtype == data.dtype and out.shape == data.shape and np.array_equal(out, data)
        assert out is not data


def test_in_place_and_non_contiguous_inputs():
    data = np.arange(20, dtype=np.float32)
    assert tnt.allreduce(data, out=data) is data
    strided = np.arange(40, dtype=np.float64)[::2]
    assert np.array_equal(tnt.allreduce(strided), strided)
    assert np.array_equal(tnt.broadcast(strided.copy()), strided)
    assert tnt.allgather(np.array([3, 4])).tolist() == [[3, 4]]
    assert tnt.broadcast_object({"a": 1}) == {"a": 1}


@pytest.mark.parametrize("call, message", [
    (lambda: tnt.allreduce(np.ones(3), op="median"), "unknown reduction op 'median'"),
    (lambda: tnt.allreduce(np.ones(3), algorithm="butterfly"), "unknown allreduce algorithm 'butterfly'"),
    (lambda: tnt.allreduce(np.ones(3, np.complex64)), "unsupported dtype 'complex64'"),
    (lambda: tnt.allreduce(np.ones(3), out=np.empty(4)), "`out` has 4 elements but the input has 3"),
    (lambda: tnt.allreduce(np.ones(3), out=np.empty(3, np.float32)), "`out` has dtype float32"),
    (lambda: tnt.broadcast(np.ones(3), root=5), "broadcast root 5 is not a rank of this group of 1"),
])
def test_bad_arguments_raise_one_line_value_errors(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def _reducer(shapes, threshold, op="sum"):
    return _engine.Reducer([(int(np.prod(s)), "float32") for s in shapes], threshold, op, "auto",
                           tnt.Group.world()._handle)


def test_bucket_layout_follows_the_fusion_threshold():
    shapes = [(256,), (256,), (256,), (1024,), (8,)]  # 1 KiB, 1 KiB, 1 KiB, 4 KiB, 32 B
    assert _reducer(shapes, 0).bucket_count == 5
    two_kib = _reducer(shapes, 2048)
    assert [two_kib.bucket_of(t) for t in range(5)] == [0, 0, 1, 1, 2]
    assert two_kib.bucket_bytes(1) == 1024 + 4096
    assert _reducer(shapes, 1 << 20).bucket_count == 1


def test_dtypes_never_share_a_bucket():
    reducer = _engine.Reducer([(4, "float32"), (4, "float64"), (4, "float64")], 1 << 20, "sum", "auto",
                              tnt.Group.world()._handle)
    assert [reducer.bucket_of(t) for t in range(3)] == [0, 1, 1]


def test_reducer_round_trip_and_misuse():
    reducer = _reducer([(3,), (2, 2)], 1 << 20, op="average")
    for step in range(3):
        reducer.ready(1, np.full((2, 2), step, np.float32))
        reducer.ready(0, np.arange(3, dtype=np.float32))
        first, second = np.empty(3, np.float32), np.empty((2, 2), np.float32)
        reducer.wait(0, first)
        reducer.wait(1, second)
        assert first.tolist() == [0, 1, 2] and np.all(second == step)
    with pytest.raises(ValueError, match="registered with 3 float32 elements"):
        reducer.ready(0, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="tensor 9 does not exist"):
        reducer.ready(9, np.ones(3, np.float32))
    reducer.close()
    with pytest.raises(ValueError, match="closed"):
        reducer.ready(0, np.ones(3, np.float32))


def test_an_idle_progress_thread_uses_no_cpu():
    reducer = _reducer([(1000,)], 0)
    before = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - before < 0.05
    reducer.close()


def test_reducer_timeline_is_ordered():
    reducer = _reducer([(10,), (10,)], 0)
    for tensor in (1, 0):
        reducer.ready(tensor, np.ones(10, np.float32))
    for tensor in (0, 1):
        reducer.wait(tensor, np.empty(10, np.float32))
    for queued, started, finished in reducer.last_step_times():
        assert 0 < queued <= started <= finished


def test_node_layout_closing_and_the_reduction_counter():
    world = tnt.Group.world()
    assert (world.node_count, world.local_rank, world.local_size, world.failed) == (1, 0, 1, False)
    assert world._handle.choose_algorithm(1 << 20) == "shared_memory"
    sub = world.split(0)
    assert tnt.allreduce(np.ones(2), group=sub).tolist() == [1, 1]
    sub.close()
    sub.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="this process group is closed"):
        tnt.allreduce(np.ones(2), group=sub)
    with pytest.raises(ValueError, match="closes with the engine at exit"):
        world.close()
    before = _engine.reductions_performed()
    reducer = _engine.Reducer([(5, "float32"), (3, "float64")], 0, "sum", "auto", world._handle)
    for step in range(3):
        reducer.ready(0, np.ones(5, np.float32))
        reducer.ready(1, np.ones(3))
        reducer.wait(0, np.empty(5, np.float32))
        reducer.wait(1, np.empty(3))
    assert reducer.reductions_completed == 3 * reducer.bucket_count == 6
    assert _engine.reductions_performed() - before == 6
    reducer.close()
    with pytest.raises(ValueError, match="closed"):
        reducer.ready(0, np.ones(5, np.float32))
    assert issubclass(tnt.GroupFailedError, tnt.EngineError)
