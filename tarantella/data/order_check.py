"""Detect input pipelines whose sample order differs between ranks, and stop the job.

Note [Same order on every rank]
Every rank reads the same user pipeline and keeps its own part of each global
batch, so the ranks must agree on the sequence of samples: with an unseeded
`shuffle`, a per-rank seed, or a generator that yields a per-rank order, each
rank would keep its part of a DIFFERENT global batch, silently losing and
repeating samples. Two checks, both cheap:
- statically, an unseeded `Dataset.shuffle()` in the pipeline is refused when
  the pipeline is distributed (tarantella/data/rank_pipeline.py);
- dynamically, the pipeline records a fingerprint of its first global batch
  (a hash of the batch's samples as they are when the rank selects its part:
  before the element-wise maps, so file names or encoded bytes, never decoded
  images) in a variable; after the first step the ranks allgather it
  (`OrderCheck`, a Keras callback that tnt.Model adds) and stop with an error
  naming the fix if the fingerprints differ. One hash of one batch and one
  allgather of 8 bytes per fit/evaluate/predict.
"""
from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from tarantella import collectives, runtime

__all__ = ["Fingerprint", "OrderMismatchError", "attach", "fingerprint_of", "verify", "OrderCheck", "callbacks"]

UNSET = -1
_HASH_BUCKETS = 2**62


class OrderMismatchError(RuntimeError):
    """The ranks' input pipelines gave different first global batches."""


class Fingerprint:
    """A hash of a pipeline's first global batch, recorded by the pipeline itself."""

    def __init__(self):
        self.variable = tf.Variable(UNSET, dtype=tf.int64, trainable=False, name="tnt_first_batch_fingerprint")

    def record(self, is_first, batch) -> None:
        """Inside a tf.data function: store the hash of `batch` when `is_first` (a bool tensor)."""
        def store():
            self.variable.assign(batch_hash(batch))
            return tf.constant(True)
        tf.cond(is_first, store, lambda: tf.constant(False))

    def value(self) -> int:
        return int(self.variable.numpy())


def batch_hash(batch) -> tf.Tensor:
    """A 62-bit hash of a structure of tensors (dense leaves only; ragged/sparse ones are skipped)."""
    leaves = [leaf for leaf in tf.nest.flatten(batch) if isinstance(leaf, tf.Tensor)]
    if not leaves:
        return tf.constant(0, tf.int64)
    serialized = tf.stack([tf.io.serialize_tensor(leaf) for leaf in leaves])
    return tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(serialized, separator="|"), _HASH_BUCKETS)


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
    """Collective: raise OrderMismatchError on every rank if the ranks' first global batches differ.
    Call it once every rank has taken its first element (e.g. after the first step of a custom loop)."""
    fingerprint = fingerprint_of(dataset)
    if fingerprint is None or runtime.get_size() == 1:
        return
    values = collectives.allgather_object(fingerprint.value())
    if len(set(values)) > 1:
        groups: dict[int, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        ranks = " vs ".join("ranks " + ",".join(map(str, members)) for members in groups.values())
        raise OrderMismatchError(
            f"tarantella: the {what} pipeline gives different first global batches on different ranks ({ranks}): "
            f"its sample order differs between ranks, so samples would be lost and repeated; give every "
            f"`shuffle` the same seed on all ranks (`dataset.shuffle(n, seed=42)`, not a per-rank seed) and make "
            f"generators and PyDatasets yield the same order on every rank")


class OrderCheck(keras.callbacks.Callback):
    """Runs `verify` after the first train/test/predict step that used one of the given datasets."""

    def __init__(self, train=None, test=None, predict=None):
        super().__init__()
        self._pending = {name: dataset for name, dataset in (("train", train), ("test", test), ("predict", predict))
                         if fingerprint_of(dataset) is not None}

    def _check(self, name: str) -> None:
        dataset = self._pending.pop(name, None)
        if dataset is not None:
            verify(dataset, {"train": "training", "test": "evaluation", "predict": "prediction"}[name])

    def on_train_batch_end(self, batch, logs=None):
        self._check("train")

    def on_test_batch_end(self, batch, logs=None):
        self._check("test")

    def on_predict_batch_end(self, batch, logs=None):
        self._check("predict")


def callbacks(train=None, test=None, predict=None) -> list[keras.callbacks.Callback]:
    """The order check for these distributed datasets, as a list to add to fit/evaluate/predict's callbacks
    (every rank must run it: it is a collective)."""
    check = OrderCheck(train, test, predict)
    return [check] if check._pending and runtime.get_size() > 1 else []
