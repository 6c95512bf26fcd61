"""Trains a small dense model (with one BatchNormalization layer) for a few steps with the timeline on (launched with --timeline).
argv[1]: "overlap", "no_overlap", "sharded" (overlap, shard="optimizer"), "sharded_gradients"
(shard="gradients": no gradient reducer), "sharded_gradients_no_overlap" or "sharded_weights" (shard="weights"). A rank prints its reducer's bucket sizes, and which buckets hold gradients, for the test."""
import json
import sys

import numpy as np

import tarantella as tnt

tnt.init()
import keras  # noqa: E402

keras.utils.set_random_seed(7)
inputs = keras.Input((32,))
hidden = keras.layers.Dense(256)(inputs)
# global statistics: one gathered allreduce forward, one for their gradient (Note [BatchNormalization over the
# global batch]), each a statistics_allreduce span
hidden = keras.layers.ReLU()(keras.layers.BatchNormalization()(hidden))
hidden = keras.layers.Dense(256, activation="relu")(hidden)
outputs = keras.layers.Dense(4)(hidden)
model = tnt.Model(keras.Model(inputs, outputs), overlap_communication=not sys.argv[1].endswith("no_overlap"),
                  shard={"sharded": "optimizer", "sharded_gradients": "gradients",
                         "sharded_gradients_no_overlap": "gradients", "sharded_weights": "weights"}.get(sys.argv[1]))
model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=False, metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).normal(size=(64 * 4, 32)).astype("float32")
y = (np.arange(64 * 4) % 4).astype("int64")
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
gradients = [a for purpose, a in model._allreducers if purpose == "gradients"]
print("BUCKETS " + json.dumps(gradients[0].bucket_bytes() if gradients else []), flush=True)
# The buckets holding gradients (the metric state may ride in the last ones: Note [Metric state rides with the
# gradients]); registered first, in backprop order.
holding = sorted({gradients[0].bucket_of(t) for t in range(len(model.trainable_variables))}) if gradients else []
print("GRADIENT_BUCKETS " + json.dumps(holding), flush=True)
