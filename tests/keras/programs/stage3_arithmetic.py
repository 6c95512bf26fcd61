"""shard="weights" (ZeRO stage 3) against shard="optimizer" (stage 1) under TensorFlow's graph optimiser, as the
README states it (issue 44 §4):

    tarantella -n 2 -- stage3_arithmetic.py

A gelu MLP and a relu MLP (AdamW with global_clipnorm and an ExponentialDecay schedule, op determinism) trained
with each stage, first with Grappler's arithmetic optimizer on (TensorFlow's default), then off. Off, stage 3
is stage 1 bit for bit; on, Grappler rewrites the element-wise arithmetic of each graph by the graph's shape,
and stage 3's backward pass recomputes each layer's forward: the relu MLP stays bitwise, gelu's may round
differently, within 1e-4 relative (Note [Weights gathered layer by layer]). One `RESULT <json>` line per
rank and set-up.
"""
import json

import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt
from serial_comparison import relative_difference

tf.config.experimental.enable_op_determinism()
rank = tnt.get_rank()
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 32)).astype(np.float32)
y = rng.integers(0, 10, 256)


def train(activation, shard):
    keras.utils.set_random_seed(3)
    plain = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation=activation),
                              keras.layers.Dense(64, activation=activation), keras.layers.Dense(10)])
    optimizer = keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(2e-3, 4, 0.9),
                                       weight_decay=0.05, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    model = tnt.Model(plain, shard=shard)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


for arithmetic in (True, False):
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": arithmetic})
    for activation in ("gelu", "relu"):
        stage1, stage3 = train(activation, "optimizer"), train(activation, "weights")
        print("RESULT " + json.dumps({"rank": rank, "arithmetic_optimization": arithmetic, "activation": activation,
                                      "relative": relative_difference(stage1, stage3)}), flush=True)
