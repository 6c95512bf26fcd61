"""A plain Keras training script that never imports tarantella (for NOT DISTRIBUTED and --wrap).

    plain_keras.py [--epochs E]

Run on N ranks as it is, every rank trains the whole data set alone; under
`tnt-repro check --wrap` its model trains through tnt.Model.
"""
import argparse

import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

keras.utils.set_random_seed(7)
x = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int32)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.05),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(x, y, batch_size=16, epochs=args.epochs, shuffle=False, verbose=0)
print(f"final loss {history.history['loss'][-1]:.6f}")
