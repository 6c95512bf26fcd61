"""A tiny tnt.Model training script with one planted reproducibility pitfall (or none).

    planted.py --pitfall none|shuffle|dropout|nondeterministic_op|unseeded_generator|crash_on_rank_1

shuffle: the script seeds Python, numpy and its initialisers but not TensorFlow,
and shuffles its tf.data pipeline without a seed. dropout: an unseeded Dropout.
nondeterministic_op: noise seeded from tf.timestamp() (TensorFlow refuses it
under op determinism). unseeded_generator: input noise from an unseeded numpy
Generator in the pipeline (no global seed reaches it). crash_on_rank_1:
rank 1 raises before training.
"""
import argparse
import random

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--pitfall", default="none")
args = parser.parse_args()

random.seed(0)
np.random.seed(0)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402

if args.pitfall == "crash_on_rank_1" and tnt.get_rank() == 1:
    raise RuntimeError("planted failure on rank 1")

x = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
dataset = tf.data.Dataset.from_tensor_slices((x, y))
if args.pitfall == "shuffle":
    dataset = dataset.shuffle(64)
else:
    dataset = dataset.shuffle(64, seed=1)
if args.pitfall == "unseeded_generator":
    noise_source = np.random.default_rng()

    def add_noise(features, label):
        noise = tf.numpy_function(lambda: noise_source.normal(size=6).astype(np.float32) * 1e-2, [], tf.float32)
        return features + tf.ensure_shape(noise, (6,)), label

    dataset = dataset.map(add_noise)
dataset = dataset.batch(16, drop_remainder=True)

init = keras.initializers.GlorotUniform(seed=3)
layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu", kernel_initializer=init)]
if args.pitfall == "dropout":
    layers.append(keras.layers.Dropout(0.5))
if args.pitfall == "nondeterministic_op":
    layers.append(keras.layers.Lambda(lambda t: t + 1e-3 * tf.random.stateless_normal(
        tf.shape(t), seed=tf.stack([tf.cast(tf.timestamp() * 1e6, tf.int64) % 100000, 0]))))
layers.append(keras.layers.Dense(2, kernel_initializer=keras.initializers.GlorotUniform(seed=4)))
model = tnt.Model(keras.Sequential(layers))
model.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(dataset, epochs=2, verbose=0)
