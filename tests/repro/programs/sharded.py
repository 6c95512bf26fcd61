"""A training script whose optimizer state is sharded (ZeRO stage 1; with `--shard gradients` stage 2: the
gradients summed on their owners), with the whole-model rule that sharding must keep (global_clipnorm over
every rank's variables): tnt-repro's exact mode must find it IDENTICAL."""
import argparse

import keras
import numpy as np

import tarantella as tnt

parser = argparse.ArgumentParser()
parser.add_argument("--shard", default="optimizer")
args = parser.parse_args()

rng = np.random.default_rng(0)
x = rng.standard_normal((128, 12)).astype(np.float32)
y = rng.integers(0, 4, 128).astype(np.int32)
model = tnt.Model(keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                                    keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]),
                  shard=args.shard)
model.compile(optimizer=keras.optimizers.Adam(1e-2, global_clipnorm=0.5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
