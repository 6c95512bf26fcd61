"""A small CNN on a tf.data pipeline (scikit-learn's bundled 8x8 digits, no download), data parallel.

    python examples/cnn_tf_data.py                            # serial
    tarantella -n 4 -- examples/cnn_tf_data.py --epochs 3     # 4 ranks, same global batch
    tnt-repro check examples/cnn_tf_data.py --devices 1,2,4 --steps 10

The pipeline follows the reproducibility rules: a seeded shuffle, and
`deterministic=True` wherever elements are processed in parallel. It is batched
with the GLOBAL batch size; tnt.Model gives each rank its part of every batch.
"""
import argparse

from tarantella.determinism import set_deterministic

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

set_deterministic(args.seed)  # before any model or dataset exists

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tarantella as tnt  # noqa: E402

images, labels = load_digits(return_X_y=True)
images = images.reshape(-1, 8, 8, 1).astype(np.float32)


def scale(image, label):
    return image / 16.0, label


dataset = (tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32)))
           .shuffle(len(images), seed=args.seed)
           .map(scale, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
           .batch(args.batch_size, drop_remainder=True)
           .prefetch(tf.data.AUTOTUNE))

model = tnt.Model(keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(10),
]))
model.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(dataset, epochs=args.epochs, verbose=0)
if tnt.is_master_rank():
    print(f"ranks={tnt.get_size()} final loss={history.history['loss'][-1]:.6f} "
          f"accuracy={history.history['accuracy'][-1]:.4f}")
