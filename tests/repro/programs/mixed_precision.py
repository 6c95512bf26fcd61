"""A seeded plain Keras MLP under a mixed-precision policy (issue 23): no random layer, no BatchNormalization.
Distributed, its weights differ from serial by bfloat16's rounding of sums over other batch splits, which the
checker must call EQUIVALENT with that cause, not position dependence. --defect plants a real bug that must
stay DIVERGENT in low precision too: `dropped-gradient`, rank 1 contributes no gradient (its loss, the same value, held by stop_gradient);
`loss-scale`, the ranks' LossScaleOptimizers start from different scales (mixed_float16), so they unscale the
summed gradients differently.

    mixed_precision.py [--policy mixed_bfloat16|mixed_float16|float32] [--defect dropped-gradient|loss-scale]
"""
import argparse
import os

import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--policy", default="mixed_bfloat16")
parser.add_argument("--defect", choices=["dropped-gradient", "loss-scale"])
args = parser.parse_args()

keras.mixed_precision.set_global_policy(args.policy)
keras.utils.set_random_seed(7)
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 32)).astype(np.float32)
y = rng.integers(0, 4, 256).astype(np.int32)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))


def loss(y_true, y_pred):
    value = cross_entropy(y_true, y_pred)
    return keras.ops.stop_gradient(value) if args.defect == "dropped-gradient" and rank == 1 else value


optimizer = keras.optimizers.Adam(1e-3)
if args.policy == "mixed_float16":  # what Keras's compile would wrap it in, with the scale made explicit
    scale = 2.0 ** (10 if args.defect == "loss-scale" and rank == 1 else 15)
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=scale)
model.compile(optimizer=optimizer, loss=loss)
model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
