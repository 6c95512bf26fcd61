"""A seeded Keras script that pipelines its model over 2 stages (a SplitLayer, tnt.Model with PIPELINING), with
Dropout before the cut and GaussianNoise after it (issue 20 §1: tnt-repro checks pipelined scripts, under op
determinism). On one rank (tnt-repro's serial reference) tnt.Model trains it serially (Note [A pipelined model
on one rank]). --batch-norm adds a BatchNormalization layer, which a pipeline normalises per micro-batch: the
checker must name that as the cause of the difference.

    pipelined.py [--batch-norm] [--schedule 1f1b|gpipe]
"""
import argparse

import keras
import numpy as np

import tarantella as tnt
from tarantella.keras.layers import SplitLayer

parser = argparse.ArgumentParser()
parser.add_argument("--batch-norm", action="store_true")
parser.add_argument("--schedule", default="1f1b")
args = parser.parse_args()

keras.utils.set_random_seed(3)
L = keras.layers
inputs = keras.Input((8,))
h = L.Dense(16, activation="relu")(inputs)
if args.batch_norm:
    h = L.BatchNormalization()(h)
h = SplitLayer()(L.Dropout(0.2, seed=5)(h))
h = L.GaussianNoise(0.1, seed=6)(L.Dense(16, activation="tanh")(h))
model = tnt.Model(keras.Model(inputs, L.Dense(3)(h)), parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                  num_micro_batches=4, schedule=args.schedule)
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 8)).astype(np.float32)
x[32:] += 1.0
y = rng.integers(0, 3, 64).astype(np.int32)
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
