"""Trains a small dense model for a few steps with the timeline on (launched with --timeline).
argv[1]: "overlap" or "no_overlap". A rank prints its reducer's bucket sizes for the test to compare."""
import json
import sys

import numpy as np

import tarantella as tnt

tnt.init()
import keras  # noqa: E402

keras.utils.set_random_seed(7)
inputs = keras.Input((32,))
hidden = keras.layers.Dense(256, activation="relu")(inputs)
hidden = keras.layers.Dense(256, activation="relu")(hidden)
outputs = keras.layers.Dense(4)(hidden)
model = tnt.Model(keras.Model(inputs, outputs), overlap_communication=(sys.argv[1] == "overlap"))
model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=False, metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).normal(size=(64 * 4, 32)).astype("float32")
y = (np.arange(64 * 4) % 4).astype("int64")
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
gradient_bytes = [a.bucket_bytes() for purpose, a in model._allreducers if purpose == "gradients"]
print("BUCKETS " + json.dumps(gradient_bytes[0]), flush=True)
