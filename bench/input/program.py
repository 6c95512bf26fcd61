"""One benchmark run on the ranks of a launch: `program.py MODE SAMPLES GLOBAL_BATCH EPOCHS`; each rank
prints one `RESULT <json>` line (bench/input/__main__.py collects them)."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from bench.input import workload  # noqa: E402
from tarantella.data import distributed_dataset, python_input  # noqa: E402
from tarantella.data.from_function import distribute_datasets_from_function  # noqa: E402


class EpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times, self._start = [], 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((workload.CROP, workload.CROP, 3)), keras.layers.AveragePooling2D(8),
                             keras.layers.Flatten(), keras.layers.Dense(workload.CLASSES)])


def main(mode: str, samples: int, global_batch: int, epochs: int) -> None:
    rank, size = tnt.get_rank(), tnt.get_size()
    jpegs, labels = workload.synthetic_jpegs(samples)
    counter = tf.Variable(0, dtype=tf.int64)
    if mode == "keras":
        net, data = model(), workload.user_pipeline(jpegs, labels, global_batch, counter)
    else:
        net = tnt.Model(model())
        if mode == "tnt":
            data = workload.user_pipeline(jpegs, labels, global_batch, counter)
        elif mode == "replicated":
            data = distributed_dataset.sliced_for_rank(
                workload.user_pipeline(jpegs, labels, global_batch, counter), size, rank)
        elif mode == "py_dataset":  # read per rank: rank r reads batch kN+r of each group of N, then exchanged
            data = workload.JpegBatches(jpegs.astype(bytes), labels, global_batch, counter)
        elif mode == "py_replicated":  # the previous behaviour: every rank reads every batch and slices its part
            data = distributed_dataset.sliced_for_rank(python_input.from_py_dataset(
                workload.JpegBatches(jpegs.astype(bytes), labels, global_batch, counter), True, 0), size, rank)
        elif mode == "shard":
            data = distribute_datasets_from_function(
                lambda context: workload.sharded_pipeline(jpegs, labels, global_batch, counter, context))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    net.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False)
    times = EpochTimes()
    net.fit(data, epochs=epochs, verbose=0, callbacks=[times])
    steady = times.times[1:] or times.times
    epoch_s = statistics.median(steady)
    decoded = int(counter.numpy()) / epochs  # per epoch (the first also counts Keras's build batch)
    trained = (samples // global_batch) * global_batch
    print("RESULT " + json.dumps({
        "mode": mode, "ranks": size, "rank": rank, "samples": samples, "global_batch": global_batch,
        "epochs": epochs, "epoch_times_s": times.times, "epoch_s": epoch_s, "decoded_per_epoch": decoded,
        "decoded_share": decoded / trained, "input_samples_per_s_per_rank": decoded / epoch_s,
        "train_samples_per_s": trained / epoch_s, "tensorflow": tf.__version__, "keras": keras.__version__}),
        flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
