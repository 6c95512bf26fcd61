"""One rank's part of the data-parallel benchmark (bench/data_parallel.py): time
training steps of one model in one mode and print `TNT_BENCH_RESULT {json}` from rank 0.

Modes:
  keras           plain Keras 3 `fit` (1 rank): the baseline for tnt.Model's overhead
  tnt             tnt.Model, gradient allreduce overlapped with backprop
  tnt_no_overlap  tnt.Model, allreduce started only once the whole backprop is done
  tnt_local_bn    tnt.Model with batch_norm="local": each rank's own BatchNormalization statistics
                  (what global statistics cost is tnt against this)
  tnt_rank_draws  tnt.Model with random layers drawing per rank, as before serial semantics (every rank
                  draws serial's first rows): what serial-equal draws cost is tnt against this
  mwms            tf.distribute.MultiWorkerMirroredStrategy; it does not support Keras 3,
                  so this mode runs the same model under Keras 2 (the tf-keras package)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

MODES = ("keras", "tnt", "tnt_no_overlap", "tnt_local_bn", "tnt_rank_draws", "mwms")


def _parse(argv):
    parser = argparse.ArgumentParser(prog="data_parallel_modes.py")
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--micro-batch", type=int, required=True, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def _rank_and_size():
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    return rank, size


def _use_keras_2_for_mwms(rank, size, port_base=23456):
    """MultiWorkerMirroredStrategy needs tf.keras = Keras 2 and a TF_CONFIG naming every worker."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import types

    import tensorflow as tf
    import tf_keras
    # The bench models are written against the API both Keras versions share, but for the
    # few keras.ops the Transformer uses; Keras 2 has no keras.ops, so they map to tf.
    tf_keras.ops = types.SimpleNamespace(
        shape=tf.shape, convert_to_tensor=tf.convert_to_tensor, matmul=tf.matmul, transpose=tf.transpose,
        not_equal=tf.not_equal, take=lambda table, ids, axis=0: tf.gather(table, ids, axis=axis))
    sys.modules["keras"] = tf_keras
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{port_base + r}" for r in range(size)]},
                                          "task": {"type": "worker", "index": rank}})


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    rank, size = _rank_and_size()
    if args.mode == "mwms":
        _use_keras_2_for_mwms(rank, size)
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", "1")))
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if args.mode == "mwms" else None
    import keras

    from bench.data.synthetic import synthetic_batch
    from bench.models.registry import get_model_entry
    entry = get_model_entry(args.model)

    class StepTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._last = [], None

        def on_train_batch_begin(self, batch, logs=None):
            if self._last is None:
                self._last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            self.times.append(now - self._last)
            self._last = now

    keras.utils.set_random_seed(args.seed)
    global_batch = args.micro_batch * size
    inputs, labels = synthetic_batch(entry, global_batch, seed=args.seed)
    if args.mode == "mwms":
        with strategy.scope():
            model = entry.build()
            model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    else:
        model = entry.build()
        if args.mode != "keras":
            import tarantella as tnt
            model = tnt.Model(model, overlap_communication=(args.mode != "tnt_no_overlap"),
                              batch_norm="local" if args.mode == "tnt_local_bn" else "global")
            if args.mode == "tnt_rank_draws":
                from tarantella.step import serial_random
                serial_random.uninstall()
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat()
    timer = StepTimes()
    model.fit(dataset, epochs=1, steps_per_epoch=args.warmup_steps + args.steps, callbacks=[timer], verbose=0)
    if rank != 0:
        return 0
    timed = timer.times[args.warmup_steps:]
    result = {"model": entry.name, "mode": args.mode, "ranks": size, "micro_batch": args.micro_batch,
              "global_batch": global_batch, "steps": args.steps, "warmup_steps": args.warmup_steps,
              "step_times_s": timed, "parameters": int(model.count_params()),
              "threads_per_rank": tf.config.threading.get_intra_op_parallelism_threads(),
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}
    print("TNT_BENCH_RESULT " + json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
