"""A small MLP on numpy arrays (scikit-learn's bundled digits, no download), data parallel.

    python examples/mlp_numpy.py                            # serial
    tarantella -n 4 -- examples/mlp_numpy.py --epochs 3     # 4 ranks, same global batch
    tnt-repro check examples/mlp_numpy.py --devices 1,2,4 --steps 10

The batch size is the GLOBAL batch size; tnt.Model shards every batch over the
ranks, and the seeded set-up makes the run reproducible.
"""
import argparse

from tarantella.determinism import set_deterministic

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
parser.add_argument("--samples", type=int, default=1536, help="training samples (a multiple of the batch size)")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

set_deterministic(args.seed)  # before any model or dataset exists

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tarantella as tnt  # noqa: E402

images, labels = load_digits(return_X_y=True)
x = (images[:args.samples] / 16.0).astype(np.float32)
y = labels[:args.samples].astype(np.int32)

model = tnt.Model(keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10),
]))
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0)
if tnt.is_master_rank():
    print(f"ranks={tnt.get_size()} final loss={history.history['loss'][-1]:.6f} "
          f"accuracy={history.history['accuracy'][-1]:.4f}")
