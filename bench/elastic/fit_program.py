"""A rank program for bench.elastic.commit_cost: tnt.Model.fit of an MLP (4 x Dense(2048), Adam), batch 256,
timing every step from one step's begin to the next's, so that the callbacks that run after a step (an elastic
job's commit) count; prints `STEPS [seconds, ...]` (after 3 warm-up steps) on rank 0. --shard MODE: tnt.Model's
shard= (the commits of a sharded model: each rank's share, and its copy on the next host)."""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tarantella as tnt  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--shard", default=None, choices=["optimizer", "gradients", "weights"])
args = parser.parse_args()


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times, self.began = [], None

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self.began is not None:
            self.times.append(now - self.began)
        self.began = now


keras.utils.set_random_seed(1)
model = tnt.Model(keras.Sequential([keras.Input((2048,))] + [keras.layers.Dense(2048, "relu") for _ in range(3)]
                                   + [keras.layers.Dense(2048)]), shard=args.shard)
model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
x = np.random.default_rng(0).random((256 * (args.steps + 4), 2048), dtype=np.float32)
timer = StepTimes()
model.fit(x, x, batch_size=256, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
if tnt.get_rank() == 0:
    print("STEPS " + json.dumps(timer.times[3:]), flush=True)
