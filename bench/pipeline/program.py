"""One benchmark run on every rank of a job; rank 0 prints one JSON line "RESULT {...}".

    program.py --mode pipeline|data|serial [--schedule 1f1b|gpipe] [--micro-batches M] [--defer default|on|off|K]
               [--stages S [--shard optimizer]] [--layers 8] [--width 512] [--batch 128] [--steps 32]
               [--budget-mib B] [--pin]

The model is a chain of `--layers` Dense layers of `--width` units (the cut,
for pipelines, is automatic and balanced by parameters). TensorFlow gets one
thread per rank so that ranks do not compete for the machine's cores; with
`--pin` each rank runs on one core of its own (local rank i on core i), all its
threads included: serial is then the model on one core.

Throughput: `samples_per_s` is the steady state, from the end of the first
timed step to the end of the last (Keras callbacks; the slowest rank), so
Keras's per-fit set-up (iterator, callbacks) and the first step's wait for the
other ranks are left out; `samples_per_s_fit` is over the whole timed `fit`.
Pipelines also report `breakdown_per_stage` (medians over the steps, ms):
Keras's step, the traced step function's call, the passes' compute, the waits
inside the function and the time outside it.

--budget-mib B: each rank may hold at most B MiB of model state (parameters
plus optimizer state). A run whose rank would hold more does not train: it
reports `fits: false` and the bytes it would need (the serial and
data-parallel runs of a model too large for one rank); a pipeline checks what
each rank really holds after training against B and reports it.

Bubble (pipelines): per step, the window is from the first pass's start to
the last pass's end over all stages (the per-pass timestamps of the traced
step, tf.timestamp, one clock: the ranks share the machine); a stage's bubble
is 1 - (its passes' compute time) / window; the run's is the mean over
stages and steps, against (S-1)/(M+S-1). The executed pass order also gives
the measured peak of micro-batches whose activations a stage held.
"""
import argparse
import contextlib
import json
import os
import resource
import sys
import time


def pin_to_one_core() -> list[int]:
    """--pin: this rank and every thread it starts (TensorFlow's, MPI's, the engine's) run on one core,
    local rank i on core i: a serial run is the model on one core, and the ranks of a job do not take each
    other's cores. Done before TensorFlow starts its threads (they inherit the affinity)."""
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0")))
    cores = sorted(os.sched_getaffinity(0))
    core = cores[local % len(cores)]
    os.sched_setaffinity(0, {core})
    return [core]


CORES = pin_to_one_core() if "--pin" in sys.argv else sorted(os.sched_getaffinity(0))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if "--launcher-threads" not in sys.argv:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from bench.machine import describe_machine, describe_software  # noqa: E402
from tarantella import memory_budget  # noqa: E402
from tarantella.step.adam_in_one_pass import adam_in_one_pass  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["pipeline", "data", "serial"], required=True)
parser.add_argument("--schedule", default="1f1b")
parser.add_argument("--micro-batches", type=int, default=4)
parser.add_argument("--defer", default="default",
                    help="pipelines' defer_weight_gradients: default (the schedule's), on, off, or micro-batches "
                         "per weight pass")
parser.add_argument("--stages", type=int, default=None,
                    help="pipelines: stages (default: one per rank); fewer make data-parallel replicas of each stage")
parser.add_argument("--shard", default=None, choices=["optimizer"],
                    help="pipelines with replicas: shard each stage's optimizer state over its replicas")
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=32)
parser.add_argument("--budget-mib", type=float, default=None)
parser.add_argument("--pin", action="store_true", help="run each rank on one core (local rank i on core i)")
parser.add_argument("--deferred", action="store_true",
                    help="build the model in tnt.deferred_weights(): a pipeline rank materialises only its stage")
parser.add_argument("--launcher-threads", action="store_true",
                    help="keep the launcher's thread counts (its defaults: each rank its share of the cores) "
                         "instead of one TensorFlow thread per rank")
parser.add_argument("--records-out", default=None,
                    help="pipelines: rank 0 also writes every rank's raw per-step pass times and step/function "
                         "times to this JSON file (to read where a step's idle time goes)")
parser.add_argument("--adam-in-one-pass", action="store_true",
                    help="serial and data modes: Keras's Adam through tarantella's one-pass update, as pipelines "
                         "take it (tarantella/step/adam_in_one_pass.py): serial with the pipeline's update")
args = parser.parse_args()
MIB = 1024.0 * 1024.0


def start_peak_rss() -> float:
    """This process's resident memory now (MiB), from which its peak is measured: the kernel's peak mark is
    reset to it (Linux's /proc/self/clear_refs "5"), so that an earlier, higher peak (making the data: a
    float64 draw, then its float32 copy) does not hide what the model adds."""
    try:
        return memory_budget.reset_peak_resident() / MIB
    except OSError:   # no such control: the peak so far is the base (what the model adds below it is not seen)
        return peak_rss_mib()


def peak_rss_mib() -> float:
    try:
        return memory_budget.peak_resident_bytes() / MIB
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    with tnt.deferred_weights() if args.deferred and args.mode != "serial" else contextlib.nullcontext():
        x = keras.Input((args.width,))
        h = x
        for i in range(args.layers):
            h = keras.layers.Dense(args.width, activation="relu", name=f"dense{i}")(h)
        return keras.Model(x, keras.layers.Dense(10, name="out")(h))


def state_bytes(variables) -> int:
    from tarantella import stage_state
    return stage_state.held_bytes(variables)


def optimizer_bytes_for(params_bytes: int) -> int:
    return 2 * params_bytes   # Adam: two slots per parameter


def live_peak(passes) -> int:
    from tarantella.pipelining.schedules import Pass, max_live_micro_batches
    executed = sorted(passes, key=lambda p: p[2])
    return max_live_micro_batches([Pass(kind, m) for kind, m, _, _ in executed])


rng = np.random.default_rng(0)
samples = args.batch * args.steps
tnt.init()
x = rng.standard_normal((samples, args.width)).astype("float32")
y = rng.standard_normal((samples, 10)).astype("float32")
rss_before = start_peak_rss()   # "memory" counts from before the model is built (the data is the user's, before it)
model = build()
whole_params = int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights))
load_before = os.getloadavg()
record = {"rank": tnt.get_rank(), "whole_params_bytes": whole_params, "cores": CORES}
needed = whole_params + optimizer_bytes_for(whole_params)
if args.mode != "pipeline" and args.budget_mib is not None and needed > args.budget_mib * MIB:
    record.update(fits=False, needed_bytes=needed)
else:
    if args.mode == "pipeline":
        from tarantella.pipeline import make_pipelined_model
        model = make_pipelined_model(model, num_micro_batches=args.micro_batches, schedule=args.schedule,
                                     num_pipeline_stages=args.stages or tnt.get_size(), balance_by="parameters",
                                     data_parallel=bool(args.stages and args.stages < tnt.get_size()),
                                     shard=args.shard,
                                     defer_weight_gradients={"default": None, "on": True, "off": False}[args.defer]
                                     if args.defer in ("default", "on", "off") else int(args.defer))
    elif args.mode == "data":
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    traces, steps = [], []

    class Trace(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.time()

        def on_train_batch_end(self, batch, logs=None):
            times = {"step": [self.began, time.time()]}
            if args.mode == "pipeline":
                trace = model.runner.trace
                traces.append(trace.passes)
                times["function"] = [trace.start, trace.end]
            steps.append(times)

    one_pass = adam_in_one_pass(model.optimizer) if args.adam_in_one_pass else contextlib.nullcontext()
    with one_pass:
        model.fit(x[:args.batch * 2], y[:args.batch * 2], batch_size=args.batch, epochs=1, verbose=0,
                  shuffle=False)  # warm-up: traces the step
        traces.clear()
        if tnt.get_size() > 1:
            tnt.barrier()
        start = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=[Trace()])
        elapsed = time.perf_counter() - start
    # Steady state: from the end of the first timed step to the end of the last (Keras's set-up of the
    # epoch, the input pipeline's start and the first step's waits for the other ranks are left out).
    steady = steps[-1]["step"][1] - steps[0]["step"][1] if len(steps) > 1 else elapsed
    record.update(fits=True, elapsed_s=elapsed, steady_s=steady, steady_steps=max(len(steps) - 1, 1),
                  peak_rss_mib=peak_rss_mib(), rss_before_mib=rss_before)
    if args.mode == "pipeline":
        params = state_bytes(model.whole_model.weights)
        optimizer = state_bytes(model.optimizer.variables)
        record.update(stage=model.placement.stage, params_bytes=params, optimizer_bytes=optimizer,
                      steps_passes=traces, steps_times=steps, live_peak=max(live_peak(t) for t in traces))
    else:
        weights = model.wrapped_model.weights if args.mode == "data" else model.weights
        params = state_bytes(weights)
        record.update(params_bytes=params, optimizer_bytes=state_bytes(model.optimizer.variables))
    if args.budget_mib is not None:
        record["within_budget"] = record["params_bytes"] + record["optimizer_bytes"] <= args.budget_mib * MIB
record["loadavg_before"], record["loadavg_after"] = load_before, os.getloadavg()
records = tnt.allgather_object(record) if tnt.get_size() > 1 else [record]


def bubble(records) -> tuple[float, list[float]]:
    """Mean over steps and stages of 1 - busy / window (module docstring)."""
    per_stage = [[] for _ in records]
    for step in range(len(records[0]["steps_passes"])):
        passes = [r["steps_passes"][step] for r in records]
        window = max(p[3] for ps in passes for p in ps) - min(p[2] for ps in passes for p in ps)
        for s, ps in enumerate(passes):
            per_stage[s].append(1.0 - sum(p[3] - p[2] for p in ps) / window)
    means = [float(np.mean(v)) for v in per_stage]
    return float(np.mean(means)), means


def breakdown(records) -> list[dict]:
    """Per stage, medians over the timed steps in ms: Keras's step (callback to callback), the
    traced step function's call, the passes' compute, the waits between passes inside the function
    (receives not yet arrived, the ops between passes), and the time outside the function (Keras's
    loop, the input, the logs)."""
    rows = []
    for r in records:
        parts = {"step_ms": [], "function_ms": [], "busy_ms": [], "wait_in_function_ms": [], "outside_function_ms": []}
        for times, passes in zip(r["steps_times"], r["steps_passes"]):
            step = times["step"][1] - times["step"][0]
            function = times["function"][1] - times["function"][0]
            busy = sum(p[3] - p[2] for p in passes)
            for key, value in (("step_ms", step), ("function_ms", function), ("busy_ms", busy),
                               ("wait_in_function_ms", function - busy), ("outside_function_ms", step - function)):
                parts[key].append(1000.0 * value)
        rows.append({key: round(float(np.median(v)), 3) for key, v in parts.items()})
    return rows


if tnt.get_rank() == 0:
    summary = {"mode": args.mode, "schedule": args.schedule if args.mode == "pipeline" else None,
               "micro_batches": args.micro_batches if args.mode == "pipeline" else None,
               "defer_weight_gradients": args.defer if args.mode == "pipeline" else None,
               "ranks": tnt.get_size(), "stages": args.stages or tnt.get_size(), "shard": args.shard,
               "adam_in_one_pass": args.adam_in_one_pass or args.mode == "pipeline",
               "layers": args.layers, "width": args.width, "global_batch": args.batch,
               "steps": args.steps, "budget_mib": args.budget_mib, "fits": all(r["fits"] for r in records),
               "whole_params_bytes": whole_params, "machine": describe_machine(), "versions": describe_software()}
    if summary["fits"]:
        elapsed = max(r["elapsed_s"] for r in records)
        steady = max(r["steady_s"] for r in records)
        summary.update(elapsed_s=elapsed, samples_per_s_fit=samples / elapsed, steady_s=steady,
                       samples_per_s=args.batch * records[0]["steady_steps"] / steady,
                       max_rank_params_fraction=max(r["params_bytes"] for r in records) / whole_params)
        if args.budget_mib is not None:
            summary["within_budget"] = all(r["within_budget"] for r in records)
    else:
        summary["needed_bytes"] = max(r.get("needed_bytes", 0) for r in records)
    if args.mode == "pipeline" and summary["fits"]:
        S, M = args.stages or tnt.get_size(), args.micro_batches
        mean, per_stage = bubble(records)
        summary.update(bubble_fraction=mean, bubble_per_stage=per_stage, ideal_bubble_fraction=(S - 1) / (M + S - 1),
                       live_peak_per_stage=[r["live_peak"] for r in records], breakdown_per_stage=breakdown(records))
    if args.records_out:
        with open(args.records_out, "w") as f:
            json.dump(records, f)
    for r in records:
        r.pop("steps_passes", None)
        r.pop("steps_times", None)
    summary["per_rank"] = records
    print("RESULT " + json.dumps(summary), flush=True)
