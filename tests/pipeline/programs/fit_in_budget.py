"""Train an 8 x Dense(WIDTH) model with Adam under the launcher's --memory-budget (issue 20 §4).

    fit_in_budget.py pipeline|data|sharded WIDTH

pipeline: built in tnt.deferred_weights() and cut into 2 stages: each rank materialises only its stage.
data: tnt.Model, every rank holds the whole model, its gradients and Adam's state.
sharded: tnt.Model(shard="gradients") (issue 21, ZeRO stage 2): every rank holds the whole model, but Adam's state
and the summed gradients of its own variables only, and no reducer buckets.
Prints "OK trained, peak <MiB> MiB" on every rank that finishes; a rank over the budget ends the job
(Note [The per-rank memory budget] in tarantella/memory_budget.py).
"""
import sys

import keras
import numpy as np

import tarantella as tnt
from tarantella import memory_budget

mode, width = sys.argv[1], int(sys.argv[2])
keras.utils.set_random_seed(0)
with tnt.deferred_weights():
    x = keras.Input((width,))
    h = x
    for i in range(8):
        h = keras.layers.Dense(width, activation="relu", name=f"dense{i}")(h)
    model = keras.Model(x, keras.layers.Dense(10, name="out")(h))
if mode == "pipeline":
    model = tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_micro_batches=4,
                      balance_by="parameters")
else:
    model = tnt.Model(model, shard="gradients" if mode == "sharded" else None)
model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
rng = np.random.default_rng(0)
model.fit(rng.standard_normal((64, width)).astype("float32"), rng.standard_normal((64, 10)).astype("float32"),
          batch_size=32, epochs=1, verbose=0)
print(f"OK trained, peak {memory_budget.peak_resident_bytes() / memory_budget.MIB:.0f} MiB", flush=True)
