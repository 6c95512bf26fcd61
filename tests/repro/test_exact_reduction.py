"""Exact mode's arithmetic (tarantella/_repro/exact_reduction.py): one process, numpy only."""
import numpy as np
import pytest

from tarantella._repro import exact_reduction

pytestmark = pytest.mark.timeout(30)


def _gradients(virtual_batches, shapes=((7, 5), (5,), (3, 3, 2)), seed=0):
    rng = np.random.default_rng(seed)
    # magnitudes spread over many binades, so that reassociation changes the rounding
    return [[(rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, size=shape)).astype(np.float32)
             for shape in shapes] for _ in range(virtual_batches)]


def _engine_allreduce(partial):
    """The engine's recursive doubling (csrc/engine/recursive_doubling_allreduce.cpp) on per-rank lists of arrays,
    step by step as it runs, every rank's result: the fold (the odd rank of each of the first 2*rem ranks adds
    its even partner's values to its own), then at step `mask` each core rank adds its partner's sum to its own,
    then the odd ranks send the result back."""
    size = len(partial)
    core = 1
    while core * 2 <= size:
        core *= 2
    remainder = size - core
    core_ranks = [2 * c + 1 if c < remainder else c + remainder for c in range(core)]
    values = [list(p) for p in partial]
    for r in range(1, 2 * remainder, 2):
        values[r] = [mine + theirs for mine, theirs in zip(values[r], values[r - 1])]
    mask = 1
    while mask < core:
        before = list(values)
        for c, rank in enumerate(core_ranks):
            values[rank] = [mine + theirs for mine, theirs in zip(before[rank], before[core_ranks[c ^ mask]])]
        mask <<= 1
    for r in range(0, 2 * remainder, 2):
        values[r] = values[r + 1]
    return values


@pytest.mark.parametrize("virtual_batches", [1, 2, 4, 8, 16])
def test_block_sums_combined_as_the_engine_does_equal_the_serial_tree_bitwise(virtual_batches):
    """Every rank count up to V, powers of two or not (Note [Exact mode's blocks])."""
    per_batch = _gradients(virtual_batches)
    serial = exact_reduction.tree_sum_lists(per_batch)
    for size in range(1, virtual_batches + 1):
        blocks = exact_reduction.rank_blocks(virtual_batches, size)
        partial = [exact_reduction.tree_sum_lists([per_batch[i] for i in block]) for block in blocks]
        for rank, result in enumerate(_engine_allreduce(partial)):
            for got, expected in zip(result, serial):
                assert got.tobytes() == expected.tobytes(), (virtual_batches, size, rank)
        # gradients_to_owners adds the ranks' values in the same order on the owner alone
        for got, expected in zip(exact_reduction.ranks_tree_sum(partial, lambda a, b: [x + y for x, y in zip(a, b)]),
                                 serial):
            assert got.tobytes() == expected.tobytes(), (virtual_batches, size)


def test_the_tree_is_not_the_sequential_sum():
    """Guards the test above: with these values the summation order is visible in the bits."""
    per_batch = _gradients(8, shapes=((64,),), seed=3)
    tree = exact_reduction.tree_sum_lists(per_batch)[0]
    sequential = per_batch[0][0].copy()
    for gradients in per_batch[1:]:
        sequential = sequential + gradients[0]
    assert tree.tobytes() != sequential.tobytes()


def test_rank_blocks_are_contiguous_aligned_powers_of_two_and_cover_all():
    for virtual_batches in (1, 2, 4, 8, 16):
        for size in range(1, virtual_batches + 1):
            blocks = exact_reduction.rank_blocks(virtual_batches, size)
            assert len(blocks) == size
            assert [i for block in blocks for i in block] == list(range(virtual_batches))
            for block in blocks:
                assert len(block) & (len(block) - 1) == 0 and block.start % len(block) == 0, (size, blocks)
            if size & (size - 1) == 0:
                assert all(len(block) == virtual_batches // size for block in blocks)
    assert exact_reduction.rank_blocks(4, 3) == [range(0, 1), range(1, 2), range(2, 4)]
    assert exact_reduction.rank_blocks(8, 6) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4), range(4, 6),
                                                 range(6, 8)]


def test_the_data_layer_gives_each_rank_its_block(monkeypatch):
    from tarantella.data import batching, distributed_dataset
    monkeypatch.setenv("TNT_EXACT_VIRTUAL_BATCHES", "4")
    assert [batching.micro_batch_size(16, 3, r) for r in range(3)] == [4, 4, 8]
    assert [batching.micro_batch_offset(16, 3, r) for r in range(3)] == [0, 4, 8]
    assert [batching.micro_batch_size(18, 3, r) for r in range(3)] == [6, 6, 6]   # no multiple of V: evenly
    for total in (16, 18, 7):
        tensors = [tuple(int(t) for t in distributed_dataset.rank_start_count(np.int64(total), 3, r))
                   for r in range(3)]
        assert tensors == [(batching.micro_batch_offset(total, 3, r), batching.micro_batch_size(total, 3, r))
                           for r in range(3)]
    monkeypatch.delenv("TNT_EXACT_VIRTUAL_BATCHES")
    assert [batching.micro_batch_size(16, 3, r) for r in range(3)] == [6, 5, 5]


@pytest.mark.parametrize("virtual_batches, size", [(3, 1), (4, 5), (4, 8), (0, 1), (4, 0)])
def test_bad_decompositions_are_user_errors(virtual_batches, size):
    with pytest.raises(ValueError, match="exact mode"):
        exact_reduction.check_decomposition(virtual_batches, size)


def test_virtual_batch_size_needs_an_even_split():
    assert exact_reduction.virtual_batch_size(64, 4) == 16
    with pytest.raises(ValueError, match="multiple of 4"):
        exact_reduction.virtual_batch_size(66, 4)


def test_tree_sum_rejects_non_power_of_two_counts():
    with pytest.raises(ValueError):
        exact_reduction.tree_sum([1.0, 2.0, 3.0])
    assert exact_reduction.tree_sum([1.0, 2.0, 3.0, 4.0]) == 10.0
