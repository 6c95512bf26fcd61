"""A seeded plain Keras script with a small residual CNN: BatchNormalization, Dropout, an augmentation
layer, `shuffle=True` (issue 19 §4). Under `tnt-repro check --wrap` it trains through tnt.Model, whose serial
semantics make it EQUIVALENT to serial training; `--local-batch-norm` wraps it itself with
`tnt.Model(model, batch_norm="local")`, which the checker must name as the cause of the divergence.

    residual_cnn.py [--local-batch-norm]
"""
import argparse

import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--local-batch-norm", action="store_true")
args = parser.parse_args()

keras.utils.set_random_seed(5)
L = keras.layers
inputs = keras.Input((6, 6, 3))
x = L.RandomFlip("horizontal", seed=1)(inputs)
x = L.ReLU()(L.BatchNormalization()(L.Conv2D(6, 3, padding="same")(x)))
x = L.Dropout(0.3, seed=2)(L.Add()([x, L.BatchNormalization()(L.Conv2D(6, 1)(inputs))]))
model = keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling2D()(x)))
if args.local_batch_norm:
    import tarantella as tnt
    model = tnt.Model(model, batch_norm="local")
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.standard_normal((48, 6, 6, 3)).astype(np.float32)
x[24:] += 1.5  # the halves of the data differ in mean: a rank's own statistics would show
y = rng.integers(0, 3, 48).astype(np.int32)
model.fit(x, y, batch_size=16, epochs=1, shuffle=True, verbose=0)
