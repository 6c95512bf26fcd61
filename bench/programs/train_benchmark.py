"""The scaling benchmark that runs on every rank: time training steps of one model.

    tarantella -n 4 -- bench/programs/train_benchmark.py --model resnet50_small \
        --global-batch 256 --steps 10 --warmup-steps 2

Trains `warmup + steps` steps with Keras `fit` on the global batch (synthetic data by
default) and prints, from the master rank, one line `TNT_BENCH_RESULT {json}` with
the time of every timed step (the slowest rank's, for --framework keras). With
--profile-out (1 rank), it also measures the model's profile for the simulation. With
--kill-rank-at K, run under `tarantella --elastic`, its last rank kills itself (SIGKILL) after
step K of the first generation, writing the time to --fault-record; the next generation's
master times its steps and says where it resumed (bench/programs/rank_fault.py).
Exit codes: 0 done, 2 bad arguments, 3 the framework is not available.
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import sys

from bench.cli import PRECISIONS
from bench.data import jpeg_pipeline
from bench.input_bound import seconds_per_batch


def _parse(argv):
    parser = argparse.ArgumentParser(prog="train_benchmark.py")
    parser.add_argument("--model", required=True)
    parser.add_argument("--framework", choices=("tnt", "keras"), default="tnt")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--data", default="synthetic", help="synthetic, jpeg, jpeg:DIR or tfds:NAME")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--decode-for-ranks", type=int, default=0, metavar="K",
                        help="--data jpeg: decode K micro-batches per one kept, as the original Tarantella's sharding "
                             "after the decode did on K ranks (Note [Sharding after the decode]); 0: own files")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="the Keras dtype policy (set before the model is built)")
    parser.add_argument("--profile-out", default=None, help="write the model profile here (1 rank)")
    parser.add_argument("--kill-rank-at", type=int, default=None, metavar="STEP",
                        help="elastic: the last rank kills itself after this step (counting warm-up)")
    parser.add_argument("--fault-record", default=None, help="with --kill-rank-at: where the rank writes the time")
    return parser.parse_args(argv)


def _configure_threads():
    import tensorflow as tf
    intra = os.environ.get("TF_NUM_INTRAOP_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(int(intra))
    inter = os.environ.get("TF_NUM_INTEROP_THREADS")
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()


def _dataset(entry, args, batch, rank, ranks):
    if args.data == "synthetic":
        from bench.data.synthetic import synthetic_dataset
        return synthetic_dataset(entry, batch, seed=args.seed + (rank if args.framework == "keras" else 0))
    if jpeg_pipeline.is_jpeg(args.data):
        files = jpeg_pipeline.train_files(_jpeg_directory(args.data))
        return jpeg_pipeline.rank_dataset(files, rank, ranks, args.global_batch // ranks, entry.image_size,
                                          entry.channels, entry.num_classes,
                                          seed=args.seed + (0 if args.decode_for_ranks else rank),
                                          decoded_ranks=args.decode_for_ranks)
    from bench.data.tfds_source import tfds_dataset
    name = args.data.split(":", 1)[1]
    examples = tfds_dataset(name, entry, "train", training=True, data_dir=args.data_dir)
    if args.framework == "keras":
        examples = examples.shard(ranks, rank)
    return examples.repeat().batch(batch, drop_remainder=True).prefetch(2)


def _jpeg_directory(data: str) -> str:
    """The set's directory: jpeg:DIR, or for `jpeg` the generated set (the master makes it if it is missing)."""
    import tarantella as tnt
    from bench.data import imagenet_like
    given = jpeg_pipeline.given_directory(data)
    if given is not None:
        return given
    directory = imagenet_like.ensure_set()[0] if tnt.get_rank() == 0 else None
    return tnt.broadcast_object(directory)


def _loss(entry):
    import keras
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _mpi_version():
    try:
        from mpi4py import MPI
        return MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    except Exception:  # mpi4py missing or MPI not loadable: a record, not a failure
        return "unknown"


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    threads = _configure_threads()
    import keras
    import numpy as np
    import tensorflow as tf

    import tarantella as tnt
    from bench.models.registry import get_model_entry
    from bench.programs.framework import FrameworkMissing, batch_per_dataset, wrap_model
    from bench.programs import rank_fault
    from bench.programs.result_line import format_result_line
    from bench.programs.step_timer import StepTimer

    rank, ranks = tnt.get_rank(), tnt.get_size()
    entry = get_model_entry(args.model)
    if args.global_batch % ranks and not args.kill_rank_at:   # the survivors of a loss split it unevenly
        print(f"train_benchmark: --global-batch {args.global_batch} is not divisible by "
              f"{ranks} ranks", file=sys.stderr)
        return 2
    keras.mixed_precision.set_global_policy(args.precision)  # mixed_float16: compile adds a LossScaleOptimizer
    keras.utils.set_random_seed(args.seed)
    keras_model = entry.build()
    try:
        model = wrap_model(keras_model, args.framework)
    except FrameworkMissing as error:
        print(f"train_benchmark: {error}", file=sys.stderr)
        return 3
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9),
                  loss=_loss(entry))
    batch = batch_per_dataset(args.framework, args.global_batch, ranks)
    dataset = _dataset(entry, args, batch, rank, ranks)
    input_alone_s = None
    if jpeg_pipeline.is_jpeg(args.data):
        tnt.barrier()
        input_alone_s = max(tnt.allgather_object(seconds_per_batch(dataset)))   # Note [Input-bound]
        if args.framework == "tnt":   # each rank's own micro-batches, from its own files
            mine = dataset
            dataset = tnt.distribute_datasets_from_function(lambda context: mine)
    timer = StepTimer(args.warmup_steps + args.steps if rank == 0 else None, args.warmup_steps)
    fault = rank_fault.RankFault(args.kill_rank_at, args.fault_record) if args.kill_rank_at else None
    tnt.barrier()
    history = model.fit(dataset, epochs=1, steps_per_epoch=args.warmup_steps + args.steps,
                        callbacks=[timer] + ([fault] if fault else []), verbose=0, shuffle=False)
    resumed = rank_fault.resumed() if fault else None   # a later generation of the elastic job: its own steps
    own_times = resumed["step_times_s"] if resumed else timer.step_times[args.warmup_steps:]
    all_times = tnt.allgather_object(own_times)
    hosts = tnt.allgather_object(socket.gethostname())
    step_times = [max(times[i] for times in all_times) for i in range(len(own_times))]

    profile = None
    if args.profile_out and rank == 0:
        profile = _measure_profile(entry, keras_model, args, step_times)
    if rank != 0:
        return 0
    if profile is not None:
        from bench.simulate.model_profile import save_profile
        save_profile(profile, args.profile_out)
    result = {
        "model": entry.name, "framework": args.framework, "ranks": ranks,
        "nodes": len(set(hosts)), "micro_batch": args.global_batch // ranks,
        "global_batch": args.global_batch, "warmup_steps": args.warmup_steps,
        "steps": args.steps, "step_times_s": step_times, "threads_per_rank": threads,
        "data": args.data, "precision": args.precision, "parameters": int(keras_model.count_params()),
        **({"input_alone_s": input_alone_s} if input_alone_s is not None else {}),
        **({"elastic": resumed} if resumed else {}),
        "final_loss": float(history.history["loss"][-1]),
        "load_average_1m": round(os.getloadavg()[0], 2),  # others' work on the machine skews times
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                     "keras": keras.__version__, "tarantella": tnt.__version__,
                     "numpy": np.__version__, "mpi": _mpi_version()},
    }
    print(format_result_line(result), flush=True)
    return 0


def _measure_profile(entry, keras_model, args, step_times):
    import numpy as np
    from bench.data.synthetic import synthetic_batch
    from bench.simulate.model_profile import batch_norm_layers, fixed_and_per_example, gradient_timeline, measure_phases

    inputs, labels = synthetic_batch(entry, args.global_batch, seed=args.seed)
    phases = measure_phases(keras_model, _loss(entry), inputs, labels)
    step_s = float(np.median(step_times))
    one_inputs, _ = synthetic_batch(entry, 1, seed=args.seed)
    update_s = max(step_s - phases["forward_backward_s"], 0.0)
    fixed_s, per_example_s = fixed_and_per_example(phases, args.global_batch, step_s)
    return {"model": entry.name, "precision": args.precision, "micro_batch": args.global_batch, "step_s": step_s,
            "forward_s": phases["forward_s"], "backward_s": phases["backward_s"],
            "update_s": update_s, "per_example_s": per_example_s,
            "fixed_s": fixed_s, "phases": phases,
            "step_times_s": list(step_times),  # their spread: the stragglers of a simulation
            "gradients": gradient_timeline(keras_model, one_inputs),
            "batch_norm": batch_norm_layers(keras_model),
            "threads": int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0") or 0) or os.cpu_count(),
            "host": socket.gethostname()}


if __name__ == "__main__":
    sys.exit(main())
