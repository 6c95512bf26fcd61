"""A custom training loop distributed with tarantella (as with Horovod's DistributedGradientTape).

    python examples/custom_loop.py                           # serial
    tarantella -n 2 -- examples/custom_loop.py --epochs 3    # 2 ranks, same global batch, same result
    python examples/custom_loop.py --check                   # also train serially in-process and compare

The dataset is batched with the GLOBAL batch size; tnt.distribute_dataset gives
this rank its micro-batch of each global batch with its share n_r / N, and
tnt.reduce_gradients sums share * gradient over the ranks (in the fused reducer,
overlapped with backprop): the gradient of the global batch's mean loss. With
--check the weights after training are compared with plain serial training of
the same model in this process (it prints `max relative difference`).
"""
import argparse

from tarantella.determinism import set_deterministic

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
parser.add_argument("--samples", type=int, default=600)
parser.add_argument("--check", action="store_true", help="compare with serial training in this process")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

set_deterministic(args.seed)  # before any model or dataset exists

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tarantella as tnt  # noqa: E402

images, labels = load_digits(return_X_y=True)
x = (images[:args.samples] / 16.0).astype(np.float32)
y = labels[:args.samples].astype(np.int64)
global_batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def train(model, dataset, distributed):
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(batch, share):
        features, targets = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(features, training=True))  # mean over this rank's micro-batch
        gradients = tape.gradient(loss, model.trainable_variables)
        if distributed:
            gradients = tnt.reduce_gradients(gradients, model.trainable_variables, share=share)
            loss = tnt.reduce_gradients([loss], share=share)[0]  # the global batch's mean loss
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    for epoch in range(args.epochs):
        losses = [float(step(batch, share)) for batch, share in dataset]
        if not distributed or tnt.is_master_rank():
            print(f"epoch {epoch + 1}: mean loss {np.mean(losses):.4f}", flush=True)
    return model


model = make_model()
tnt.broadcast_variables(model.variables)  # every rank starts from the master's weights
train(model, tnt.distribute_dataset(global_batches), distributed=True)
if args.check:
    serial = train(make_model(), global_batches.map(lambda *batch: (batch, 1.0)), distributed=False)
    difference = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12))
                     for a, b in zip(serial.get_weights(), model.get_weights()))
    print(f"rank {tnt.get_rank()}: max relative difference {difference:.2e}", flush=True)
