"""The benchmark's data and pipelines: synthetic JPEGs, decoded and augmented per sample."""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["IMAGE", "CROP", "CLASSES", "synthetic_jpegs", "decode_and_augment", "user_pipeline", "sharded_pipeline",
           "JpegBatches"]

IMAGE, CROP, CLASSES = 96, 80, 10


def synthetic_jpegs(count: int, distinct: int = 64, seed: int = 0):
    """`count` (jpeg bytes, label) pairs: `distinct` smooth random images encoded once, repeated."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(distinct, 12, 12, 3)).astype(np.float32)
    images = tf.cast(tf.image.resize(coarse, (IMAGE, IMAGE)), tf.uint8)
    encoded = [tf.io.encode_jpeg(image, quality=90).numpy() for image in images]
    jpegs = np.array([encoded[i % distinct] for i in range(count)], dtype=object)
    labels = (np.arange(count) % CLASSES).astype(np.int64)
    return jpegs, labels


def decode_and_augment(counter: tf.Variable):
    """The per-sample work: decode, random crop, random flip, scale; counts its calls in `counter`."""
    def work(jpeg, label):
        counter.assign_add(1)
        image = tf.io.decode_jpeg(jpeg, channels=3)
        image = tf.image.random_crop(image, (CROP, CROP, 3))
        image = tf.image.random_flip_left_right(image)
        return tf.cast(image, tf.float32) / 255.0, label
    return work


def user_pipeline(jpegs, labels, global_batch: int, counter: tf.Variable) -> tf.data.Dataset:
    """What a user writes: shuffle (seeded), map the per-sample work, batch by the global batch."""
    return (tf.data.Dataset.from_tensor_slices((jpegs.astype(bytes), labels)).shuffle(len(labels), seed=1)
            .map(decode_and_augment(counter), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def sharded_pipeline(jpegs, labels, global_batch: int, counter: tf.Variable, context) -> tf.data.Dataset:
    """tf.distribute's AutoShardPolicy.DATA by hand: every rank reads all, keeps every N-th, per-replica batch."""
    return (tf.data.Dataset.from_tensor_slices((jpegs.astype(bytes), labels))
            .shard(context.num_input_pipelines, context.input_pipeline_id).shuffle(len(labels), seed=1)
            .map(decode_and_augment(counter), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(context.get_per_replica_batch_size(global_batch), drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE))


class JpegBatches(keras.utils.PyDataset):
    """What a Keras user writes instead of tf.data: a PyDataset whose __getitem__ decodes and augments one global
    batch, sample by sample (the same work as the map, run eagerly), with worker threads as Keras offers."""

    def __init__(self, jpegs, labels, global_batch: int, counter: tf.Variable, workers: int = 2):
        super().__init__(workers=workers)
        self.jpegs, self.labels, self.global_batch = jpegs, labels, global_batch
        self.work = decode_and_augment(counter)

    def __len__(self):
        return len(self.labels) // self.global_batch

    def __getitem__(self, index):
        rows = range(index * self.global_batch, (index + 1) * self.global_batch)
        images = [self.work(tf.constant(self.jpegs[row]), self.labels[row])[0].numpy() for row in rows]
        return np.stack(images), self.labels[rows.start:rows.stop]
