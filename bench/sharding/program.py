"""One run of issue 21's memory benchmark, started by bench/sharding/memory.py through the launcher:

    tarantella -n N -- bench/sharding/program.py --shard off|optimizer|gradients|weights [--model mlp|transformer]
                                               [--width 4096 --depth 6 --batch 64 --steps 6]

The model is built in tnt.deferred_weights() (no weight takes memory before tnt.Model gives storage to those
this rank holds: all of them, or its own with shard="weights") and trained data-parallel by
tnt.Model(shard=...) with Adam for `steps` steps of the global batch:
bench/sharding/models.py's mlp or transformer.
Rank 0 prints one RESULT line (JSON) with every rank's figures:
- optimizer_state_mib: the bytes of the rank's optimizer variables (slots, iteration count), exact;
- gradient_memory_mib: the bytes the gradient reduction holds for the optimizer, by the engine's layout, not
  measured: the summed gradients it hands over (every variable's; with shard="gradients" or "weights" the owned
  ones') plus
  the fused reducer's buckets, which on one node live in two areas of shared memory for the whole run (Note
  [Two copies per gradient byte] in csrc/engine/fused_reducer.hpp; none with shard="gradients"). The local
  gradients backprop makes are the same in every mode and not counted;
- weights_held_mib: the bytes of the trainable weights this rank keeps between steps and between layers (all of
  them, or with shard="weights" its own; a pass adds the gathered weights of at most two layers), exact;
- peak_rss_growth_mib: peak resident memory (VmHWM, the kernel's peak mark reset to the resident memory just
  before the model is built) minus that resident memory, i.e. weights, gradients, the reducer's buffers,
  optimizer state, activations and TensorFlow's working memory;
- step_s: the median time of a training step after the first two (tracing, warm-up).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import tensorflow as tf  # noqa: F401  (before keras, as in user scripts)
import keras

import tarantella as tnt
from tarantella import memory_budget
from tarantella import stage_state
from bench.sharding import models

parser = argparse.ArgumentParser()
parser.add_argument("--shard", default="off")
parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--depth", type=int, default=6)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
MIB = 1024.0 * 1024.0


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times, self._began = [], 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._began)


rank, size = tnt.get_rank(), tnt.get_size()
samples = args.batch * args.steps
x, y = models.random_data(args.model, args.width, samples)
load_before = os.getloadavg()
baseline = memory_budget.reset_peak_resident() / MIB   # making the data peaked higher: not the model's

keras.utils.set_random_seed(1)
with tnt.deferred_weights():
    built = models.build(args.model, args.width, args.depth)
model = tnt.Model(built, shard=args.shard)
model.compile(optimizer=keras.optimizers.Adam(1e-4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
times = StepTimes()
model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[times])


def variable_bytes(variables) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


held = [v for v in model.trainable_variables if not stage_state.is_released(v)]
summed = model._sharded_update.owned if args.shard in ("gradients", "weights") and size > 1 else held
buckets = sum(model._gradient_allreducer.bucket_bytes()) if model._gradient_allreducer is not None else 0
mine = {
    "rank": rank,
    "gradient_memory_mib": (variable_bytes(summed) + 2 * buckets) / MIB,
    "optimizer_state_mib": variable_bytes(model.optimizer.variables) / MIB,
    "weights_held_mib": variable_bytes(held) / MIB,
    "peak_rss_growth_mib": memory_budget.peak_resident_bytes() / MIB - baseline,
    "step_s": statistics.median(times.times[2:] or times.times),
    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
}
everyone = tnt.allgather_object(mine)
if rank == 0:
    params = model.count_params()
    print("RESULT " + json.dumps({"shard": args.shard, "ranks": size, "model": args.model, "width": args.width,
                                  "depth": args.depth,
                                  "params": params, "weights_mib": params * 4 / MIB, "global_batch": args.batch,
                                  "steps": args.steps, "per_rank": everyone}), flush=True)
