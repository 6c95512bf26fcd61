"""Synthetic inputs: one fixed random batch, repeated, shaped like the model's real data.

Reading and decoding are then free, so a sweep measures compute and communication
only, as the seeds' throughput figures do.
"""
from __future__ import annotations

import numpy as np

from bench.models.registry import ModelEntry

__all__ = ["synthetic_batch", "synthetic_dataset"]


def synthetic_batch(entry: ModelEntry, batch_size: int, seed: int = 0):
    """(inputs, labels) numpy arrays for one batch."""
    rng = np.random.default_rng(seed)
    if entry.kind == "image":
        images = rng.standard_normal((batch_size, entry.image_size, entry.image_size, entry.channels),
                                     dtype=np.float32)
        labels = rng.integers(0, entry.num_classes, size=(batch_size,), dtype=np.int32)
        return images, labels
    length = entry.sequence_length
    tokens = rng.integers(3, entry.vocab_size, size=(batch_size, length + 1), dtype=np.int32)
    source = rng.integers(3, entry.vocab_size, size=(batch_size, length), dtype=np.int32)
    return {"source": source, "target_in": tokens[:, :-1]}, tokens[:, 1:]


def synthetic_dataset(entry: ModelEntry, batch_size: int, seed: int = 0):
    """A tf.data.Dataset yielding the same batch of `batch_size` forever."""
    import tensorflow as tf
    return tf.data.Dataset.from_tensors(synthetic_batch(entry, batch_size, seed)).repeat()
