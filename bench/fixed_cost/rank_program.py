"""One launch of the fixed-cost benchmark (bench/fixed_cost/__init__.py): one model in one mode on
however many ranks the launcher started; prints `TNT_BENCH_RESULT {json}` from rank 0 with every
rank's figures.

    tarantella -n 2 -- bench/fixed_cost/rank_program.py --mode tnt --model mlp8x512 --micro-batch 128
    tarantella -n 2 -- bench/fixed_cost/rank_program.py --mode collectives --model mlp8x512 resnet50_small
    tarantella -n 2 -- bench/fixed_cost/rank_program.py --mode paired --model mlp8x512 --pairs 6

Mode `paired` times plain Keras and tnt.Model in ONE process per rank, their fits alternating
(Keras, lockstep, tnt, tnt, lockstep, Keras, ...; at 2 ranks both ranks' Keras fits run at once, with no
exchange; lockstep is the Keras fit with a barrier after every step, _lockstep_callback): all three
see the same process, cores and moment, so the per-pair ratio tnt / Keras is free of the
launch-to-launch spread (several % on small models) that separate launches add to their difference.
Keras fits the tnt.Model's own wrapped model (tnt's compile compiles it alike, with the same
optimizer): the two fits update the SAME variables and optimizer state. Two separately built copies
of one model differ by up to 4% in step time at 1 rank in one process (mlp8x512:32, steps
interleaved; where their buffers landed in memory), which paired fits of two models measured as
tnt.Model's overhead. Every rank's Keras fit trains on the same micro-batches, so the weights stay
equal on all ranks, as tnt.Model keeps them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

MODES = ("keras", "tnt", "tnt_metrics_after", "collectives", "paired")


def _parse(argv):
    parser = argparse.ArgumentParser(prog="bench/fixed_cost/rank_program.py")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--model", nargs="+", required=True, help="one model (several for --mode collectives)")
    parser.add_argument("--micro-batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--repetitions", type=int, default=10, help="collectives: timed calls per figure")
    parser.add_argument("--pairs", type=int, default=6, help="paired: Keras and tnt fits, alternating")
    return parser.parse_args(argv)


def _threads():
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", "1")))
    return tf


class _Ranks:
    """Rank, size, barrier and gather to rank 0: through tarantella, or (plain Keras on several ranks,
    which must not touch the engine) through mpi4py."""

    def __init__(self, use_tarantella: bool):
        if use_tarantella:
            import tarantella as tnt
            self.rank, self.size = tnt.get_rank(), tnt.get_size()
            self.barrier = tnt.barrier
            self._gather = tnt.allgather_object
        else:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
            self.rank, self.size = comm.Get_rank(), comm.Get_size()
            self.barrier = comm.Barrier
            self._gather = comm.allgather

    def gather(self, value):
        return self._gather(value)


def _compiled(spec, mode: str):
    """The model of `spec` (seeded), compiled alike for every mode; wrapped in tnt.Model unless mode is keras."""
    import keras
    keras.utils.set_random_seed(1)
    model = spec.build()
    if mode != "keras":
        import tarantella as tnt
        model = tnt.Model(model)
        model._metrics_ride = mode != "tnt_metrics_after"  # Note [Metric state rides with the gradients]
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False)
    return model


def _fitter(spec, model, mode: str, args, ranks: _Ranks, same_data_on_every_rank: bool = False):
    """fit(steps, callbacks): `steps` steps of the same micro-batch size on every rank. tnt.Model takes
    the global batch; plain Keras on every rank trains its own micro-batches (the same ones on every
    rank with `same_data_on_every_rank`)."""
    distributed = mode != "keras"
    batch = args.micro_batch * (ranks.size if distributed else 1)
    seed = 1 + ranks.rank * (not distributed and not same_data_on_every_rank)

    def fit(steps, callbacks=()):
        x, y = spec.data(batch * steps, seed=seed)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))

    return fit


def _timed_fit(fit, steps: int, ranks: _Ranks, callbacks=()) -> list[float]:
    """Every step's seconds of one fit of `steps` steps, begun by all ranks together."""
    from bench.programs.step_timer import StepTimer
    ranks.barrier()  # both ranks' timed steps start together
    timer = StepTimer()
    fit(steps, [timer, *callbacks])
    return timer.step_times


def _lockstep_callback(barrier):
    """A Keras callback that ends every train step with `barrier`: plain Keras on every rank made to run in
    lockstep, moving no data. What that adds over free-running Keras on every rank is the least any
    synchronous exchange adds, whatever it moves and however fast: every step waits for the slower rank.
    At one rank it measures the callback's own cost."""
    import keras

    class Lockstep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            barrier()

    return Lockstep()


def _description(spec, model, ranks: _Ranks) -> dict:
    import keras
    import tensorflow as tf
    parameters = int(sum(int(v.shape.num_elements()) for v in model.trainable_variables))
    return {"model": spec.name, "parameters": parameters, "gradient_bytes": 4 * parameters,
            "threads_per_rank": tf.config.threading.get_intra_op_parallelism_threads(),
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}


def _train(args, ranks: _Ranks) -> dict:
    _threads()
    from bench.fixed_cost import models
    spec = models.get(args.model[0])
    model = _compiled(spec, args.mode)
    fit = _fitter(spec, model, args.mode, args, ranks)
    fit(args.warmup_steps)  # traces the step, warms caches
    times = ranks.gather(_timed_fit(fit, args.steps, ranks))
    reducer = ranks.gather(_last_step_reduction(model))
    return {**_description(spec, model, ranks), "reducer_last_step": reducer, "micro_batch": args.micro_batch,
            "global_batch": args.micro_batch * ranks.size,
            "step_times_s": times[0], "rank_step_times_s": times,
            "median_step_s": statistics.median(times[0]),
            "rank_median_step_s": [statistics.median(t) for t in times]}


def _paired(args, ranks: _Ranks) -> dict:
    """Plain Keras and tnt.Model in this one process, their fits alternating `--pairs` times (see the
    module's docstring); per pair and rank, each one's median step."""
    _threads()
    from bench.fixed_cost import models
    spec = models.get(args.model[0])
    distributed = _compiled(spec, "tnt")
    fits = {"keras": (distributed.wrapped_model, _fitter(spec, distributed.wrapped_model, "keras", args, ranks,
                                                         same_data_on_every_rank=True)),
            "tnt": (distributed, _fitter(spec, distributed, "tnt", args, ranks))}
    for _, fit in fits.values():
        fit(args.warmup_steps)  # traces the step, warms caches
    # Keras in lockstep: the same fit as Keras's, with a barrier after every step (_lockstep_callback)
    fits["lockstep"] = fits["keras"]
    extra = {"lockstep": [_lockstep_callback(ranks.barrier)]}
    pairs = []
    for index in range(args.pairs):
        pair = {}
        # Keras first in even pairs, tnt first in odd ones: a drift of the machine's speed during the run
        # favours neither.
        for mode in ("keras", "lockstep", "tnt") if index % 2 == 0 else ("tnt", "lockstep", "keras"):
            pair[mode] = statistics.median(_timed_fit(fits[mode][1], args.steps, ranks, extra.get(mode, ())))
        pairs.append(pair)
    every_rank = ranks.gather(pairs)  # [rank][pair] -> {"keras": s, "lockstep": s, "tnt": s}
    reducer = ranks.gather(_last_step_reduction(fits["tnt"][0]))
    return {**_description(spec, fits["tnt"][0], ranks), "micro_batch": args.micro_batch,
            "global_batch": args.micro_batch * ranks.size, "rank_pairs": every_rank, "reducer_last_step": reducer}


def _last_step_reduction(model) -> dict | None:
    """Where the last timed step's gradient reduction went, from the engine's bucket times (read after the
    fit: nothing is added to the timed steps): buckets, allreduce busy seconds, the span from the first
    bucket's start to the last one's end, and the tail from the last hand-over (the last gradient, or the
    metric state) to the last result: the reduction time backprop could not hide."""
    allreducer = getattr(model, "_gradient_allreducer", None)
    if allreducer is None:
        return None
    times = allreducer.last_step_times()
    return {"buckets": len(times), "busy_s": sum(finished - started for _, started, finished in times),
            "span_s": max(f for _, _, f in times) - min(s for _, s, _ in times),
            "tail_s": max(f for _, _, f in times) - max(q for q, _, _ in times)}


def _timed(call, ranks: _Ranks, repetitions: int) -> list[float]:
    """Seconds of `call()` after a barrier, `repetitions` times after one untimed call."""
    call()
    times = []
    for _ in range(repetitions):
        ranks.barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _collectives(args, ranks: _Ranks) -> dict:
    tf = _threads()
    import keras
    import numpy as np
    from mpi4py import MPI

    import tarantella as tnt
    from bench.fixed_cost import models
    from tarantella import _engine, runtime
    settings = runtime.settings()
    world = tnt.Group.world()._handle
    rows = []
    for name in args.model:
        spec = models.get(name)
        variables = spec.build().trainable_variables
        shapes = [tuple(v.shape) for v in variables][::-1]  # backprop order, as tnt.Model registers them
        counts = [int(np.prod(shape)) for shape in shapes]
        total = sum(counts)
        buffer = np.random.default_rng(ranks.rank).standard_normal(total).astype(np.float32)
        scratch = np.empty_like(buffer)
        figures = {}
        figures["engine_allreduce_s"] = _timed(lambda: tnt.allreduce(buffer), ranks, args.repetitions)
        figures["mpi_allreduce_s"] = _timed(
            lambda: MPI.COMM_WORLD.Allreduce(buffer, scratch, op=MPI.SUM), ranks, args.repetitions)
        figures["memcpy_s"] = _timed(lambda: np.copyto(scratch, buffer), ranks, args.repetitions)
        figures["barrier_s"] = _timed(ranks.barrier, ranks, args.repetitions)  # the lockstep fit's own rendezvous
        reducer = _engine.Reducer([(count, "float32") for count in counts], settings.fusion_threshold_bytes,
                                  "sum", settings.allreduce_algorithm, world)
        pieces = np.split(buffer, np.cumsum(counts)[:-1])
        outs = [np.empty(count, np.float32) for count in counts]

        def reducer_step():
            for index, piece in enumerate(pieces):
                reducer.ready(index, piece)
            for index, out in enumerate(outs):
                reducer.wait(index, out)

        copied = _engine.copied_bytes() if hasattr(_engine, "copied_bytes") else None
        figures["reducer_step_s"] = _timed(reducer_step, ranks, args.repetitions)
        copies = None
        if copied is not None:
            copies = (_engine.copied_bytes() - copied) / (4 * total * (args.repetitions + 1))
        row = {"model": spec.name, "gradient_bytes": 4 * total, "tensors": len(counts),
               "buckets": reducer.bucket_count, "buckets_in_shared_memory": getattr(
                   reducer, "buckets_in_shared_memory", None), "reducer_copies_per_byte": copies,
               "fusion_threshold_bytes": settings.fusion_threshold_bytes,
               "algorithm": settings.allreduce_algorithm}
        reducer.close()
        for key, times in figures.items():
            every_rank = ranks.gather(statistics.median(times))
            row[key] = max(every_rank)  # a collective ends when its slowest rank does
            row[key.replace("_s", "_times_s")] = times
        rows.append(row)
    return {"rows": rows, "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    ranks = _Ranks(use_tarantella=args.mode != "keras")
    run = {"collectives": _collectives, "paired": _paired}.get(args.mode, _train)
    result = run(args, ranks)
    if ranks.rank == 0:
        from bench.programs.result_line import format_result_line
        print(format_result_line({"mode": args.mode, "ranks": ranks.size, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
