"""One process plays every rank: each rank's rewritten pipeline against serial's global batches.

For each pipeline and rank count, the ranks' micro-batches laid side by side must
be serial's global batches (same samples, same order, same global sizes and
positions), and the element-wise map must run on each rank only for that rank's
samples (counted by a tf.Variable in the map).
"""
import logging

import numpy as np
import pytest
import tensorflow as tf

from tarantella.data import batching, dataset_graph, distributed_dataset as dd, order_check, rank_pipeline, user_input

SIZES = (1, 2, 3, 4)
N = 23  # uneven: partial last batches, and empty micro-batches at 4 ranks with batch 5 (23 = 4*5 + 3)


def counted(count: tf.Variable):
    """An element-wise map that counts its calls (the 'expensive' per-sample work)."""
    def work(i):
        count.assign_add(1)
        return {"image": tf.fill([2], tf.cast(i, tf.float32)), "id": i}, i % 3
    return work


PIPELINES = {
    "map_batch": lambda c: tf.data.Dataset.range(N).map(counted(c)).batch(5),
    "shuffle_parallel_map_batch": lambda c: tf.data.Dataset.range(N).shuffle(N, seed=7).map(
        counted(c), num_parallel_calls=3, deterministic=True).batch(5),
    "map_then_shuffle_repeat_take": lambda c: tf.data.Dataset.range(N).map(counted(c)).shuffle(
        10, seed=3).repeat(2).take(40).batch(6),
    "filter_then_map_drop_remainder": lambda c: tf.data.Dataset.range(N).filter(lambda i: i % 4 != 1).map(
        counted(c)).batch(4, drop_remainder=True).prefetch(2),
    "cache_then_map_batch_shuffled": lambda c: tf.data.Dataset.range(N).cache().map(counted(c)).batch(5).shuffle(
        5, seed=11).prefetch(1),
    "padded_batch": lambda c: tf.data.Dataset.range(N).map(
        lambda i: (tf.fill([tf.cast(i % 4 + 1, tf.int32)], i), i)).map(
        lambda x, i: (x, counted(c)(i)[1])).padded_batch(5, padded_shapes=([4], [])),
}


def serial_batches(dataset):
    return [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in dataset]


def concatenate(parts):
    return tf.nest.map_structure(lambda *pieces: np.concatenate(pieces), *parts)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_rewritten_pipeline_gives_serial_batches_and_maps_only_own_samples(name):
    count = tf.Variable(0, dtype=tf.int64)
    serial = serial_batches(PIPELINES[name](count))
    serial_maps = int(count.numpy())
    assert not isinstance(rank_pipeline.plan(PIPELINES[name](count)), str)
    for size in SIZES:
        streams, maps = [], []
        for rank in range(size):
            count.assign(0)
            stream = user_input.distribute(PIPELINES[name](count), size=size, rank=rank)
            streams.append([tf.nest.map_structure(lambda t: t.numpy(), e) for e in stream])
            maps.append(int(count.numpy()))
        assert all(len(stream) == len(serial) for stream in streams), (name, size)
        for b, batch in enumerate(serial):
            total = len(tf.nest.flatten(batch)[0])
            offset = sum(len(tf.nest.flatten(s)[0]) for s in serial[:b])
            glued = concatenate([stream[b][dd.DATA] for stream in streams])
            tf.nest.map_structure(np.testing.assert_array_equal, glued, batch)
            for rank, stream in enumerate(streams):
                assert stream[b][dd.GLOBAL_SIZE] == total
                assert stream[b][dd.FIRST_INDEX] == offset + batching.micro_batch_offset(total, size, rank)
        # Each rank maps about 1/size of the samples (plus one placeholder where its last micro-batch is empty).
        if name != "cache_then_map_batch_shuffled":
            assert sum(maps) <= serial_maps + size, (name, size, maps, serial_maps)
        assert max(maps) <= serial_maps // size + len(serial) + 1, (name, size, maps, serial_maps)


def test_array_input_gathers_only_the_micro_batch():
    """Arrays are captured once; every step's element holds only the rank's rows (never the whole array)."""
    x = np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8)
    stream = user_input.distribute(x, batch_size=100, size=4, rank=1)
    shapes = {tuple(e[dd.DATA].shape) for e in stream}
    assert shapes == {(25, 8)}
    graph = stream._as_serialized_graph().numpy()
    assert graph.count(x[1].tobytes()) <= 1  # the data set is in the graph once, not once per step


@pytest.mark.parametrize("pipeline,transformation", [
    (lambda: tf.data.Dataset.range(N).batch(5).map(lambda b: b * 2), "Dataset.map() after Dataset.batch()"),
    (lambda: tf.data.Dataset.range(N).batch(5).filter(lambda b: tf.size(b) > 2), "Dataset.filter() after"),
    (lambda: tf.data.Dataset.range(N).batch(5).unbatch().batch(4), None),
    (lambda: tf.data.Dataset.range(N).window(5).flat_map(lambda w: w.batch(5)), "no Dataset.batch() found"),
])
def test_unrewritable_pipelines_fall_back_with_one_warning(pipeline, transformation, caplog):
    serial = serial_batches(pipeline())
    for size in (1, 3):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tarantella"):
            streams = [[e[dd.DATA].numpy() for e in user_input.distribute(pipeline(), size=size, rank=rank)]
                       for rank in range(size)]
        for b, batch in enumerate(serial):
            np.testing.assert_array_equal(np.concatenate([s[b] for s in streams]), batch)
        warnings = [r.getMessage() for r in caplog.records if r.name == "tarantella"]
        if transformation is None or size == 1:  # unbatch().batch(): the last batch is rewritten
            assert not warnings
        else:
            assert len(warnings) == 1 and transformation in warnings[0], warnings


def test_map_before_filter_is_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tarantella"):
        user_input.distribute(tf.data.Dataset.range(N).map(lambda i: i * 2).filter(lambda i: i > 3).batch(4),
                              size=2, rank=0)
    messages = [r.getMessage() for r in caplog.records if r.name == "tarantella"]
    assert len(messages) == 1 and "Dataset.map() before Dataset.filter()" in messages[0]


def test_unseeded_shuffle_is_refused_on_several_ranks():
    dataset = tf.data.Dataset.range(N).shuffle(10).batch(4)
    with pytest.raises(ValueError, match=r"unseeded Dataset.shuffle\(\).*seed=42"):
        user_input.distribute(dataset, size=2, rank=0)
    assert len(list(user_input.distribute(dataset, size=1, rank=0))) == 6


def test_links_are_named_as_the_user_wrote_them():
    _, links = dataset_graph.transformations(
        tf.data.Dataset.range(4).map(lambda i: i).shuffle(4, seed=1).take(3).padded_batch(2).unbatch().prefetch(1))
    names = [link.name for link in links]
    assert names[:4] == ["Dataset.map()", "Dataset.shuffle()", "Dataset.take()", "Dataset.padded_batch()"]
    assert "Dataset.unbatch()" in names and names[-1] == "Dataset.prefetch()"


def _fingerprints(make, rank, size=2):
    """The order check's (position: fingerprint) of rank `rank`'s stream after one full pass."""
    stream = user_input.from_batched_dataset(make(rank), size, rank)
    for _ in stream:
        pass
    return order_check.fingerprint_of(stream).positions()


@pytest.mark.parametrize("kind", ["rewritten", "read_in_full"])
def test_order_fingerprints_agree_and_catch_late_and_batch_level_differences(kind):
    """Equal pipelines give equal fingerprints at every position on every rank; a per-rank seed of a shuffle
    AFTER the batch, or one swapped pair of samples in the last batch, changes the fingerprint (Note [Same
    order on every rank]); the ring keeps the last RING positions of the pass."""
    maps = (lambda d: d.map(lambda i: (tf.cast(i, tf.float32), i % 3))) if kind == "rewritten" else \
        (lambda d: d.map(lambda i: (tf.cast(i, tf.float32), i % 3)).batch(1).unbatch())  # unbatch: read in full

    def same(rank):
        return maps(tf.data.Dataset.range(N)).batch(5).shuffle(4, seed=1)

    def batch_shuffle_per_rank(rank):
        return maps(tf.data.Dataset.range(N)).batch(5).shuffle(4, seed=1 + rank)

    def last_swapped(rank):
        order = np.arange(N)
        if rank:
            order[[-1, -2]] = order[[-2, -1]]
        return maps(tf.data.Dataset.from_tensor_slices(order)).batch(5)

    equal = [_fingerprints(same, rank) for rank in (0, 1)]
    assert sorted(equal[0]) == list(range(5)) and equal[0] == equal[1]
    shuffled = [_fingerprints(batch_shuffle_per_rank, rank) for rank in (0, 1)]
    assert shuffled[0][4] != shuffled[1][4]  # (batches read in full: from the first batch that differs on)
    swapped = [_fingerprints(last_swapped, rank) for rank in (0, 1)]
    assert [swapped[0][p] == swapped[1][p] for p in range(5)] == [True] * 4 + [False]
    long = _fingerprints(lambda rank: maps(tf.data.Dataset.range(order_check.RING + 7)).batch(1), 0)
    assert sorted(long) == list(range(7, order_check.RING + 7))
