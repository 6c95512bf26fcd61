"""Detect input pipelines whose sample order differs between ranks, and stop the job.

Note [Same order on every rank]
Every rank reads the same user pipeline and keeps its own part of each global
batch, so the ranks must agree on the sequence of samples: with an unseeded
`shuffle`, a per-rank seed, or a generator that yields a per-rank order, each
rank would keep its part of a DIFFERENT global batch, silently losing and
repeating samples. Two checks, both cheap:
- statically, an unseeded `Dataset.shuffle()` in the pipeline is refused when
  the pipeline is distributed (tarantella/data/rank_pipeline.py);
- dynamically, the pipeline folds a hash of EVERY global batch into a rolling
  fingerprint (`batch_hash`: the batch as it is when the rank selects its part,
  before the element-wise maps, so file names or encoded bytes, never decoded
  images; at most 64 values per sample, strings hashed one by one). In a
  rewritten pipeline (rank_pipeline.py) the fold runs where the rank selects
  its samples, and the links after the batch (a batch-level shuffle, take,
  skip, repeat) enter as the fold's starting value, a number made of their
  constant seeds and counts: a per-rank seed there changes it. In a pipeline
  read in full, the fold runs on the batches as they finally come out. A ring
  of the last RING (position, fingerprint) pairs is kept in a variable; the
  ranks allgather their rings (2 KiB) after the first step and at the end of
  every epoch and of evaluate/predict (`OrderCheck`, a Keras callback that
  tnt.Model adds), and compare the fingerprints at the last position all of
  them reached (the pipelines run ahead of the steps by their prefetch, by
  different amounts). A difference at any batch so far stops every rank with
  an error naming the fix. Per step: one hash and one variable write.
The fingerprint restarts with every pass over the pipeline (every epoch's
iterator); all ranks make the same passes.
"""
from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from tarantella import collectives, runtime

__all__ = ["Fingerprint", "OrderMismatchError", "attach", "fingerprint_of", "verify", "OrderCheck", "callbacks",
           "batch_hash", "RING"]

RING = 128              # positions kept: more than any pipeline's read-ahead in global batches
_HASH_BUCKETS = 2**62
_VALUES_PER_SAMPLE = 64  # hashed per sample and leaf: enough to tell samples apart, bounded cost
_MODULUS, _MULTIPLIER = 2**31 - 1, 1_000_003  # the rolling fold (a different batch changes it but for 1 in 2**31)


class OrderMismatchError(RuntimeError):
    """The ranks' input pipelines gave different global batches."""


class Fingerprint:
    """A rolling hash of the global batches a pipeline gave out, folded by the pipeline itself (in its scan)."""

    def __init__(self):
        # Rows 0..RING-1: (position in the pass, fingerprint up to it) at row position % RING; row RING:
        # the latest. Written by one op per batch, so a reader on another thread never sees half a row.
        self.ring = tf.Variable(tf.fill([RING + 1, 2], tf.constant(-1, tf.int64)), trainable=False,
                                name="tnt_order_fingerprints")
        self.salt = 0  # where every pass's fold starts: a number for the pipeline's batch-level links

    def start(self) -> tf.Tensor:
        """The fingerprint before a pass's first batch (keep it in the pipeline's scan state)."""
        return tf.constant(self.salt % _MODULUS, tf.int64)

    def fold(self, position, fingerprint, hashed) -> tf.Tensor:
        """Inside a tf.data scan, once per global batch in output order: `position` counts the pass's
        batches from 0, `fingerprint` is the one before (start() for the first), `hashed` the batch's
        batch_hash. Returns the fingerprint after it, recorded in the ring. One variable op, no strings,
        no branches: it runs for every step."""
        folded = (fingerprint * _MULTIPLIER + hashed % _MODULUS) % _MODULUS  # < 2**52: no overflow
        row = tf.stack([position, folded])
        self.ring.scatter_nd_update(tf.stack([[position % RING], [RING]]), tf.stack([row, row]))
        return folded

    def positions(self) -> dict[int, int]:
        """{position: fingerprint up to it} of the last RING global batches of the current pass. (A row
        left from an earlier pass has a position the current pass has not reached, or has overwritten.)"""
        rows = self.ring.numpy()
        latest = int(rows[RING][0])
        return {int(p): int(f) for p, f in rows[:RING] if p >= 0 and latest - RING < p <= latest}


def batch_hash(batch) -> tf.Tensor:
    """A 62-bit hash of a batch (a structure of tensors; ragged/sparse leaves are skipped), from at most
    64 values of each sample and leaf, and the batch's shapes."""
    leaves = [leaf for leaf in tf.nest.flatten(batch) if isinstance(leaf, tf.Tensor)]
    if not leaves:
        return tf.constant(0, tf.int64)
    parts = []
    for leaf in leaves:
        rows = tf.reshape(leaf, [tf.shape(leaf)[0], -1]) if leaf.shape.rank else tf.reshape(leaf, [1, 1])
        rows = rows[:, :_VALUES_PER_SAMPLE]
        if rows.dtype == tf.string:  # one number per string (file contents, encoded images): no copies joined
            rows = tf.strings.to_hash_bucket_fast(rows, _HASH_BUCKETS)
        parts += [tf.io.serialize_tensor(tf.shape(leaf)), tf.io.serialize_tensor(rows)]
    return tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(tf.stack(parts), separator="|"), _HASH_BUCKETS)


_FINGERPRINTS: "weakref.WeakKeyDictionary[tf.data.Dataset, Fingerprint]" = weakref.WeakKeyDictionary()


def attach(dataset: tf.data.Dataset, fingerprint: Fingerprint) -> tf.data.Dataset:
    _FINGERPRINTS[dataset] = fingerprint
    return dataset


def fingerprint_of(dataset) -> Fingerprint | None:
    try:
        return _FINGERPRINTS.get(dataset)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def verify(dataset, what: str = "input") -> None:
    """Collective: raise OrderMismatchError on every rank if the ranks' global batches so far differ.
    Call it on every rank once each has taken an element (e.g. after the first step of a custom loop, and
    at the end of each epoch)."""
    fingerprint = fingerprint_of(dataset)
    if fingerprint is None or runtime.get_size() == 1:
        return
    rings = collectives.allgather_object(fingerprint.positions())
    common = set.intersection(*(set(ring) for ring in rings))
    if not common:  # a rank gave out nothing yet, or is more than RING batches ahead: nothing to compare
        return
    position = max(common)
    groups: dict[int, list[int]] = {}
    for rank, ring in enumerate(rings):
        groups.setdefault(ring[position], []).append(rank)
    if len(groups) > 1:
        ranks = " vs ".join("ranks " + ",".join(map(str, members)) for members in groups.values())
        raise OrderMismatchError(
            f"tarantella: the {what} pipeline gave different global batches on different ranks ({ranks}) among "
            f"the first {position + 1} of this pass over it: its sample or batch order differs between ranks, so "
            f"samples would be lost and repeated; give every `shuffle` (before or after `batch`) the same seed "
            f"on all ranks (`dataset.shuffle(n, seed=42)`, not a per-rank seed) and make generators and "
            f"PyDatasets yield the same order on every rank")


class OrderCheck(keras.callbacks.Callback):
    """Runs `verify` after the first train/test/predict step that used one of the given datasets (early:
    before an epoch of wrong training), and at the end of every epoch, evaluation and prediction."""

    _NAMES = {"train": "training", "test": "evaluation", "predict": "prediction"}

    def __init__(self, train=None, test=None, predict=None):
        super().__init__()
        self._datasets = {name: dataset for name, dataset in (("train", train), ("test", test), ("predict", predict))
                          if fingerprint_of(dataset) is not None}
        self._first_done: set[str] = set()

    def _check(self, name: str) -> None:
        if name in self._datasets:
            verify(self._datasets[name], self._NAMES[name])

    def _check_first(self, name: str) -> None:
        if name not in self._first_done:
            self._first_done.add(name)
            self._check(name)

    def on_train_batch_end(self, batch, logs=None):
        self._check_first("train")

    def on_test_batch_end(self, batch, logs=None):
        self._check_first("test")

    def on_predict_batch_end(self, batch, logs=None):
        self._check_first("predict")

    def on_epoch_end(self, epoch, logs=None):
        self._check("train")

    def on_test_end(self, logs=None):
        self._check("test")

    def on_predict_end(self, logs=None):
        self._check("predict")


def callbacks(train=None, test=None, predict=None) -> list[keras.callbacks.Callback]:
    """The order check for these distributed datasets, as a list to add to fit/evaluate/predict's callbacks
    (every rank must run it: it is a collective)."""
    check = OrderCheck(train, test, predict)
    return [check] if check._datasets and runtime.get_size() > 1 else []
