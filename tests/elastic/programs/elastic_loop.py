"""A custom training loop under `tarantella --elastic`, committing with tnt.elastic.State.

    elastic_loop.py [--kill GEN:RANK:COMMIT]

An MLP trains 3 epochs of 8 global batches of 16 with tnt.reduce_gradients; the state (model, optimizer,
epoch, batch) is committed after every step. --kill 1:1:7 makes rank 1 of generation 1 kill itself (SIGKILL)
after its 7th commit. Rank 0 prints `RESET {...}` when a later generation restored (its reset callback) and at
the end `RESULT {...}` with the weights and the generation.
"""
import argparse
import json
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--kill", default=None)
args = parser.parse_args()
GENERATION = int(os.environ.get("TNT_ELASTIC_GENERATION", "1"))

keras.utils.set_random_seed(5)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, "relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(0.01)
optimizer.build(model.trainable_variables)
tnt.broadcast_variables(model.variables)
rng = np.random.default_rng(3)
x = rng.normal(size=(128, 6)).astype(np.float32)
y = (x[:, :1] * 2 - x[:, 1:2]).astype(np.float32)
dataset = tnt.distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(128, seed=2).batch(16))


@tf.function
def step(batch, share):
    features, targets = batch
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(features, training=True) - targets) ** 2)
    gradients = tnt.reduce_gradients(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                     share=share)
    optimizer.apply(gradients, model.trainable_variables)


state = tnt.elastic.State(model=model, optimizer=optimizer, epoch=0, batch=0)
state.register_reset_callbacks([lambda: tnt.is_master_rank() and print(
    "RESET " + json.dumps({"size": tnt.get_size(), "epoch": state.epoch, "batch": state.batch}), flush=True)])
state.restore()
kill = tuple(map(int, args.kill.split(":"))) if args.kill else None
commits = 0
for epoch in range(3):
    for batch, (data, share) in enumerate(dataset):   # one iterator per epoch, as before the loss
        if (epoch, batch) < (state.epoch, state.batch):
            continue
        step(data, share)
        state.epoch, state.batch = epoch, batch + 1
        state.commit()
        commits += 1
        if kill and kill[:2] == (GENERATION, tnt.get_rank()) and commits == kill[2]:
            os.kill(os.getpid(), signal.SIGKILL)
state.flush()
if tnt.is_master_rank():
    print("RESULT " + json.dumps({"generation": GENERATION, "size": tnt.get_size(),
                                  "weights": [w.tolist() for w in model.get_weights()],
                                  "iterations": int(optimizer.iterations.numpy())}), flush=True)
