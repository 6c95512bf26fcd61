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


@pytest.mark.parametrize("virtual_batches", [1, 2, 4, 8, 16])
def test_block_sums_combined_pairwise_equal_the_serial_tree_bitwise(virtual_batches):
    per_batch = _gradients(virtual_batches)
    serial = exact_reduction.tree_sum_lists(per_batch)
    size = 1
    while size <= virtual_batches:
        # each "rank" sums its block with the tree, then recursive doubling combines the ranks:
        # at step `mask`, rank r adds its partner's partial sum to its own (partner first on odd ranks).
        partial = [exact_reduction.tree_sum_lists([per_batch[i] for i in exact_reduction.rank_block(
            virtual_batches, size, rank)]) for rank in range(size)]
        mask = 1
        while mask < size:
            partial = [[mine + theirs if rank & mask == 0 else theirs + mine
                        for mine, theirs in zip(partial[rank], partial[rank ^ mask])] for rank in range(size)]
            mask <<= 1
        for rank in range(size):
            for got, expected in zip(partial[rank], serial):
                assert got.tobytes() == expected.tobytes(), (virtual_batches, size, rank)
        size *= 2


def test_the_tree_is_not_the_sequential_sum():
    """Guards the test above: with these values the summation order is visible in the bits."""
    per_batch = _gradients(8, shapes=((64,),), seed=3)
    tree = exact_reduction.tree_sum_lists(per_batch)[0]
    sequential = per_batch[0][0].copy()
    for gradients in per_batch[1:]:
        sequential = sequential + gradients[0]
    assert tree.tobytes() != sequential.tobytes()


def test_rank_blocks_are_contiguous_aligned_and_cover_all():
    for virtual_batches in (1, 2, 4, 8):
        size = 1
        while size <= virtual_batches:
            blocks = [exact_reduction.rank_block(virtual_batches, size, rank) for rank in range(size)]
            assert [i for block in blocks for i in block] == list(range(virtual_batches))
            assert all(len(block) == virtual_batches // size for block in blocks)
            size *= 2


@pytest.mark.parametrize("virtual_batches, size", [(3, 1), (4, 3), (4, 8), (0, 1)])
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
