"""The batch-distribution arithmetic over many (global batch, ranks, dataset size) combinations."""
import itertools

import numpy as np
import pytest

from tarantella.data import batching

SIZES = (1, 2, 3, 4, 5, 7, 8, 16)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("global_batch", list(range(0, 40)) + [64, 127, 1000])
def test_micro_batches_tile_the_global_batch(global_batch, size):
    bounds = [(batching.micro_batch_offset(global_batch, size, r), batching.micro_batch_size(global_batch, size, r))
              for r in range(size)]
    position = 0
    for offset, count in bounds:
        assert offset == position
        position += count
    assert position == global_batch
    counts = [count for _, count in bounds]
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)  # the larger micro-batches come first


@pytest.mark.parametrize("num_samples,global_batch,size",
                         list(itertools.product((0, 1, 5, 17, 32, 33, 100, 101), (1, 3, 4, 8, 32, 50), (1, 2, 3, 4, 7))))
def test_ranks_together_see_every_sample_once_in_order(num_samples, global_batch, size):
    per_rank = [batching.rank_sample_indices(num_samples, global_batch, size, r) for r in range(size)]
    assert sorted(np.concatenate(per_rank).tolist()) == list(range(num_samples))
    # Interleaving by global batch, then by rank, gives back epoch order.
    order = []
    taken = [0] * size
    for batch_size in batching.global_batch_sizes(num_samples, global_batch):
        for rank in range(size):
            count = batching.micro_batch_size(batch_size, size, rank)
            order.extend(per_rank[rank][taken[rank]:taken[rank] + count].tolist())
            taken[rank] += count
    assert order == list(range(num_samples))


def test_partial_last_batch():
    assert batching.global_batch_sizes(10, 4) == [4, 4, 2]
    assert batching.global_batch_sizes(8, 4) == [4, 4]
    assert batching.global_batch_sizes(0, 4) == []
    # 2 samples left over 3 ranks: the last rank gets none, but still exists.
    assert [batching.micro_batch_size(2, 3, r) for r in range(3)] == [1, 1, 0]
    assert batching.rank_sample_indices(10, 4, 3, 2).tolist() == [3, 7]


def test_global_batch_smaller_than_rank_count_is_an_error():
    batching.check_global_batch_size(4, 4)
    with pytest.raises(ValueError, match="GLOBAL batch size.*at least 5"):
        batching.check_global_batch_size(4, 5)


@pytest.mark.parametrize("num_samples,split,expected", [(100, 0.2, 80), (10, 0.25, 7), (3, 0.5, 1)])
def test_validation_split_matches_keras(num_samples, split, expected):
    assert batching.validation_split_at(num_samples, split) == expected


def test_validation_split_must_leave_both_parts():
    with pytest.raises(ValueError):
        batching.validation_split_at(1, 0.5)
    with pytest.raises(ValueError):
        batching.validation_split_at(10, 1.0)
