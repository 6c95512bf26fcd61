"""One process: PyDataset, generator and pipelined-model input against their global batches, and input errors."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tarantella import memory_budget
from tarantella.data import distributed_dataset as dd, python_input, user_input
from tarantella.pipelining import data as pipeline_data

X = np.arange(30 * 2, dtype=np.float32).reshape(30, 2)
Y = np.arange(30, dtype=np.int64)


class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.epochs_ended = 0

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return X[index * 8:(index + 1) * 8], Y[index * 8:(index + 1) * 8]

    def on_epoch_end(self):
        self.epochs_ended += 1


def side_by_side(make, size):
    streams = [[tf.nest.map_structure(lambda t: t.numpy(), e) for e in make(rank)] for rank in range(size)]
    assert len({len(s) for s in streams}) == 1
    return [tf.nest.map_structure(lambda *p: np.concatenate(p), *[s[b][dd.DATA] for s in streams])
            for b in range(len(streams[0]))]


@pytest.mark.parametrize("size", [1, 3])
def test_a_generator_gives_its_batches_in_parts(size):
    expected = [Batches()[i] for i in range(4)]
    make = lambda rank: user_input.distribute((b for b in expected), size=size, rank=rank)  # noqa: E731
    for got, want in zip(side_by_side(make, size), expected):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("per_rank", [False, True])
def test_a_py_dataset_gives_its_batches_shuffled_the_same_way_and_ends_epochs(per_rank):
    # per_rank: the N-rank path (read, cut, exchanged all-to-all) on a job of one rank.
    data = Batches()
    stream = (python_input.py_dataset_for_rank(data, True, 3, 1, 0) if per_rank
              else user_input.distribute(data, shuffle=True, seed=3, size=1, rank=0))
    for _ in range(2):  # two passes: two epochs, each a permutation of the batches
        got = [tf.nest.map_structure(lambda t: t.numpy(), e) for e in stream]
        assert sorted(int(e[dd.DATA][1][0]) for e in got) == [0, 8, 16, 24]
        sizes = [len(e[dd.DATA][1]) for e in got]
        assert [int(e[dd.FIRST_INDEX]) for e in got] == list(np.cumsum([0] + sizes[:-1]))
        for e in got:
            np.testing.assert_array_equal(e[dd.DATA][0], X[e[dd.DATA][1]])
    assert data.epochs_ended == 3  # as Keras: once before the first epoch, then after each


def test_a_global_batch_is_cut_into_the_ranks_micro_batches():
    batch = ({"a": X[:5], "b": Y[:5]}, Y[:5] * 2, np.ones(5, np.float32))
    signature = python_input._signature(batch)
    pieces = python_input._cut(batch, 3, signature)
    assert [len(leaves[0]) for leaves, _ in pieces] == [2, 2, 1] and all(int(total) == 5 for _, total in pieces)
    for leaf, *parts in zip(tf.nest.flatten(batch), *[leaves for leaves, _ in pieces]):
        np.testing.assert_array_equal(np.concatenate(parts), leaf)
    small = python_input._cut(tf.nest.map_structure(lambda a: a[:1], batch), 3, signature)
    assert [len(leaves[0]) for leaves, _ in small] == [1, 0, 0]  # empty micro-batches for the last ranks


@pytest.mark.parametrize("bad,message", [
    (dict(x=Batches(), y=Y), "pass targets and sample weights inside it"),
    (dict(x=Batches(), batch_size=8), "cannot be used with a keras.utils.PyDataset"),
    (dict(x=Batches(), micro_batch_size=2), "tnt_micro_batch_size applies to unbatched"),
    (dict(x=tf.data.Dataset.range(4), batch_size=2), "batch the input with the global batch size"),
    (dict(x="not data"), "unsupported input of type str"),
])
def test_bad_inputs_get_one_line_errors(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        user_input.distribute(**bad, size=2, rank=0)


@pytest.mark.parametrize("kind", ["arrays", "dataset"])
def test_a_pipeline_stage_gets_its_replicas_part_and_only_what_it_uses(kind):
    def make(replica, first, last):
        x = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10) if kind == "dataset" else X
        return pipeline_data.replica_batches(x, None if kind == "dataset" else Y, batch_size=None if kind == "dataset"
                                             else 10, num_replicas=2, replica=replica, first_stage=first,
                                             last_stage=last)
    for first, last in ((True, False), (False, True), (False, False)):
        parts = [[e for e in make(replica, first, last)] for replica in range(2)]
        for b in range(3):
            x = np.concatenate([p[b][dd.DATA][0].numpy() for p in parts])
            y = np.concatenate([p[b][dd.DATA][1].numpy() for p in parts])
            assert all(int(p[b][dd.GLOBAL_SIZE]) == 10 for p in parts)
            np.testing.assert_array_equal(x, X[b * 10:(b + 1) * 10] if first else np.zeros([0]))
            np.testing.assert_array_equal(y, Y[b * 10:(b + 1) * 10] if last else np.zeros([0]))


def test_arrays_are_read_in_place_not_copied_whole():
    """A rank's input holds the user's arrays and one batch's rows, not a TensorFlow copy of the whole input
    (256 MiB here: a copy would show as that much more resident memory)."""
    x = np.ones((4096, 16384), np.float32)
    before = memory_budget.resident_bytes() / memory_budget.MIB
    stream = user_input.distribute(x, batch_size=64, shuffle=True, size=2, rank=1)
    first = next(iter(stream))
    grown = memory_budget.resident_bytes() / memory_budget.MIB - before
    assert grown < 64, f"reading one batch made the process {grown:.0f} MiB larger"
    np.testing.assert_array_equal(first[dd.DATA].numpy(), np.ones((32, 16384), np.float32))


@pytest.mark.parametrize("in_place", [True, False], ids=["read-in-place", "copied"])
def test_arrays_give_the_same_micro_batches_read_in_place_or_copied(in_place, monkeypatch):
    monkeypatch.setattr(dd, "READ_IN_PLACE_FROM", 0 if in_place else 1 << 62)
    x = {"a": X, "b": X[:, :1].astype(np.float64)}
    weights = np.linspace(0, 1, 30)
    for rank in range(3):
        stream = list(user_input.distribute(x, Y, weights, batch_size=9, shuffle=True, seed=3, size=3, rank=rank))
        order = np.concatenate([e[dd.DATA][1].numpy() for e in stream])   # Y is each sample's index
        first = stream[0][dd.DATA]
        assert first[0]["a"].shape == (3, 2) and first[0]["b"].dtype == tf.float64 and first[2].dtype == tf.float64
        np.testing.assert_array_equal(np.concatenate([e[dd.DATA][0]["a"].numpy() for e in stream]), X[order])
        np.testing.assert_array_equal(np.concatenate([e[dd.DATA][2].numpy() for e in stream]), weights[order])
        assert [int(e[dd.GLOBAL_SIZE]) for e in stream] == [9, 9, 9, 3]
