"""One benchmark run on every rank of a job; rank 0 prints one JSON line "RESULT {...}".

    program.py --mode pipeline|data|serial [--schedule 1f1b|gpipe] [--micro-batches M]

The model is a chain of `--layers` Dense layers of `--width` units (the cut,
for pipelines, is automatic and balanced). TensorFlow gets one thread per rank
so that ranks do not compete for the machine's cores.
"""
import argparse
import json
import resource
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["pipeline", "data", "serial"], required=True)
parser.add_argument("--schedule", default="1f1b")
parser.add_argument("--micro-batches", type=int, default=4)
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((args.width,))
    h = x
    for i in range(args.layers):
        h = keras.layers.Dense(args.width, activation="relu", name=f"dense{i}")(h)
    return keras.Model(x, keras.layers.Dense(10, name="out")(h))


rng = np.random.default_rng(0)
samples = args.batch * args.steps
x = rng.standard_normal((samples, args.width)).astype("float32")
y = rng.standard_normal((samples, 10)).astype("float32")
model = build()
rss_before = peak_rss_mib()
if args.mode == "pipeline":
    from tarantella.pipeline import make_pipelined_model
    model = make_pipelined_model(model, num_micro_batches=args.micro_batches, schedule=args.schedule,
                                 num_pipeline_stages=tnt.get_size(), balance_by="parameters")
elif args.mode == "data":
    model = tnt.Model(model)
model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")

bubbles, step_times = [], []


class Trace(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if args.mode == "pipeline":
            trace = model.runner.trace
            bubbles.append((trace.end - trace.start, trace.busy))


model.fit(x[:args.batch * 2], y[:args.batch * 2], batch_size=args.batch, epochs=1, verbose=0, shuffle=False)  # warm-up
bubbles.clear()
if tnt.get_size() > 1:
    tnt.barrier()
start = time.perf_counter()
model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=[Trace()])
elapsed = time.perf_counter() - start
record = {"rank": tnt.get_rank(), "peak_rss_mib": peak_rss_mib(), "rss_before_mib": rss_before,
          "elapsed_s": elapsed}
if bubbles:
    wall = sum(w for w, _ in bubbles)
    record.update(schedule_wall_s=wall, busy_s=sum(b for _, b in bubbles))
    record["stage"] = model.placement.stage
    record["stage_params"] = int(sum(np.prod(v.shape) for v in model.stage_model.weights))
else:
    record["stage_params"] = int(sum(np.prod(v.shape) for v in (model.wrapped_model if args.mode == "data"
                                                                 else model).weights))
records = tnt.allgather_object(record) if tnt.get_size() > 1 else [record]
if tnt.get_rank() == 0:
    summary = {"mode": args.mode, "schedule": args.schedule if args.mode == "pipeline" else None,
               "micro_batches": args.micro_batches if args.mode == "pipeline" else None,
               "ranks": tnt.get_size(), "layers": args.layers, "width": args.width, "global_batch": args.batch,
               "steps": args.steps, "elapsed_s": max(r["elapsed_s"] for r in records),
               "samples_per_s": samples / max(r["elapsed_s"] for r in records), "per_rank": records}
    if args.mode == "pipeline":
        S, M = tnt.get_size(), args.micro_batches
        per_stage = [1.0 - r["busy_s"] / r["schedule_wall_s"] for r in records]
        summary.update(bubble_fraction=float(np.mean(per_stage)), bubble_per_stage=per_stage,
                       ideal_bubble_fraction=(S - 1) / (M + S - 1))
    print("RESULT " + json.dumps(summary), flush=True)
