"""Run on N ranks: every input kind of fit/evaluate/predict against serial Keras, counting the samples each
rank's pipeline maps; one `RESULT <json>` line per check (tests/data/test_input_multirank.py reads them)."""
import json
import os
import tempfile
import threading

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from tarantella.data import distributed_dataset as dd, order_check, user_input  # noqa: E402
from tarantella.data.from_function import distribute_datasets_from_function  # noqa: E402

RANK, SIZE = tnt.get_rank(), tnt.get_size()
N, BATCH, EPOCHS = 96, 12, 2


def report(check, **values):
    print("RESULT " + json.dumps({"check": check, "rank": RANK, "size": SIZE, **values}), flush=True)


def relative_difference(a, b):
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-12)) for x, y in zip(a, b))


def features(i):
    """Sample i, computed (the 'decode' step): 8 features and a class."""
    x = tf.sin(tf.cast(i, tf.float32) * tf.range(1.0, 9.0) * 0.37)
    return x, i % 3


def counted(counter):
    def decode(i):
        counter.assign_add(1)
        return features(i)
    return decode


def model_pair():
    models = []
    for wrap in (lambda m: m, tnt.Model):
        keras.utils.set_random_seed(5)
        model = wrap(keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                       keras.layers.Dense(3)]))
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                      jit_compile=False)
        models.append(model)
    return models


def fit_both(make_input, **fit_args):
    """Train serial Keras and tnt.Model on the same input; the weights' distance and each one's map count."""
    serial, distributed = model_pair()
    counter = tf.Variable(0, dtype=tf.int64)
    serial.fit(make_input(counter, serial=True), epochs=EPOCHS, verbose=0, **fit_args.get("serial", {}))
    serial_count = int(counter.numpy())
    counter.assign(0)
    distributed.fit(make_input(counter, serial=False), epochs=EPOCHS, verbose=0, **fit_args.get("distributed", {}))
    return serial, distributed, dict(weights=relative_difference(serial.get_weights(), distributed.get_weights()),
                                     serial_maps=serial_count, rank_maps=int(counter.numpy()))


# 0. The engine's all-to-all (the PyDataset exchange's data plane): blocks of every size, empty ones included.
from tarantella import _engine, collectives  # noqa: E402

received = _engine.alltoall_bytes([bytes([RANK]) * (RANK * 3 + s) for s in range(SIZE)], collectives._handle(None))
try:
    _engine.alltoall_bytes([b""] * (SIZE + 1), collectives._handle(None))
    refused = ""
except ValueError as error:
    refused = str(error)
report("alltoall", exact=[bytes(block) == bytes([j]) * (j * 3 + RANK) for j, block in enumerate(received)],
       refused=refused)


# 1. Batched tf.data: seeded shuffle, parallel deterministic map, batch, prefetch.
def batched(counter, serial):
    return tf.data.Dataset.range(N).shuffle(N, seed=7).map(counted(counter), num_parallel_calls=2,
                                                           deterministic=True).batch(BATCH).prefetch(2)


serial, distributed, values = fit_both(batched)
# The same pipeline keeping the sample ids: the ranks' micro-batches side by side are serial's batches.
counter = tf.Variable(0, dtype=tf.int64)
# A new dataset object for each: a reshuffling dataset's second iteration has another order (on 1 rank
# `distribute` iterates the user's own object, on several a rewritten copy of it).
def identified():
    return tf.data.Dataset.range(N).shuffle(N, seed=7).map(lambda i: (i, counter.assign_add(1)),
                                                           num_parallel_calls=2, deterministic=True).batch(BATCH)


mine = [element[dd.DATA][0].numpy() for element in user_input.distribute(identified(), size=SIZE, rank=RANK)]
serial_ids = [batch[0].numpy() for batch in identified()]
check_counter = tf.Variable(0, dtype=tf.int64)
report("batched_dataset", **values, stream_maps=int(counter.numpy()) - N,
       batches_match=len(mine) == len(serial_ids) and all(
           np.array_equal(np.concatenate(tnt.allgather_object(part)), ids) for part, ids in zip(mine, serial_ids)),
       evaluate=[float(v) for v in distributed.evaluate(batched(check_counter, False), verbose=0)],
       serial_evaluate=[float(v) for v in serial.evaluate(batched(check_counter, True), verbose=0)],
       predict=float(np.max(np.abs(distributed.predict(batched(check_counter, False), verbose=0)
                                   - serial.predict(batched(check_counter, True), verbose=0)))))


# 2. Unbatched tf.data + tnt_micro_batch_size (serial: batch of micro * ranks).
def unbatched(counter, serial):
    samples = tf.data.Dataset.range(N).map(counted(counter))
    return samples.batch(3 * SIZE) if serial else samples


_, _, values = fit_both(unbatched, distributed={"tnt_micro_batch_size": 3})
report("unbatched_micro_batches", **values)


# 3. keras.utils.PyDataset: each rank reads about 1/N of the batches (batch kN+r of each group of N), the
# micro-batches exchanged all-to-all; training equal to serial.
class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __len__(self):
        return N // BATCH

    def __getitem__(self, index):
        self.calls += 1
        i = np.arange(index * BATCH, (index + 1) * BATCH)
        x, y = features(tf.constant(i[:, None]))
        return x.numpy().reshape(BATCH, 8), y.numpy().reshape(BATCH)


serial, distributed = model_pair()
serial.fit(Batches(), epochs=EPOCHS, shuffle=False, verbose=0)
batches = Batches()
distributed.fit(batches, epochs=EPOCHS, shuffle=False, verbose=0)
report("py_dataset", weights=relative_difference(serial.get_weights(), distributed.get_weights()),
       calls=batches.calls)


# 3a. A PyDataset of dicts with sample weights, shuffling its own samples in on_epoch_end (seeded), 9 batches
# (a last group of fewer batches than ranks at 2 ranks) the last of 1 sample (an empty micro-batch): fit,
# evaluate and predict equal to serial; each sample of an epoch exactly once; reads counted per rank.
class OwnShuffle(keras.utils.PyDataset):
    COUNT, LAST = 9, 1

    def __init__(self):
        super().__init__()
        self.calls, self.seen, self.ended = 0, [], 0
        self.rng = np.random.default_rng(11)
        self.order = np.arange((self.COUNT - 1) * BATCH + self.LAST)

    def __len__(self):
        return self.COUNT

    def __getitem__(self, index):
        self.calls += 1
        ids = self.order[index * BATCH:(index + 1) * BATCH].copy()  # the order is shuffled in place
        self.seen.append(ids)
        x = np.sin(ids[:, None].astype(np.float32) * np.arange(1.0, 9.0, dtype=np.float32) * np.float32(0.37))
        return {"features": x}, ids % 3, (1.0 + (ids % 4)).astype(np.float32)

    def on_epoch_end(self):
        self.ended += 1
        self.rng.shuffle(self.order)


def dict_model(wrap):
    keras.utils.set_random_seed(5)
    inputs = {"features": keras.Input((8,), name="features")}
    outputs = keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs["features"]))
    model = wrap(keras.Model(inputs, outputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=["accuracy"],
                  jit_compile=False)
    return model


serial, distributed = dict_model(lambda m: m), dict_model(tnt.Model)
serial.fit(OwnShuffle(), epochs=EPOCHS, shuffle=False, verbose=0)
own = OwnShuffle()
distributed.fit(own, epochs=EPOCHS, shuffle=False, verbose=0)
# Every sample of each epoch read once over all ranks, plus the master's peek at the first batch (ids 0..11).
read = np.concatenate([ids for rank_seen in tnt.allgather_object(own.seen) for ids in rank_seen])
report("py_dataset_own_shuffle", weights=relative_difference(serial.get_weights(), distributed.get_weights()),
       calls=own.calls, ended=own.ended,
       all_once=sorted(read.tolist()) == sorted(list(range(len(own.order))) * EPOCHS + list(range(BATCH))),
       evaluate=[float(v) for v in distributed.evaluate(OwnShuffle(), verbose=0)],
       serial_evaluate=[float(v) for v in serial.evaluate(OwnShuffle(), verbose=0)],
       predict=float(np.max(np.abs(distributed.predict(OwnShuffle(), verbose=0)
                                   - serial.predict(OwnShuffle(), verbose=0)))))


# 3c. Streams left part-way (steps_per_epoch, evaluate/predict steps, stop_training): the ranks exchange
# exactly as far as the steps consumed (no read-ahead past the exchange), so nothing waits for a peer.
_, distributed = model_pair()
partial = Batches()
distributed.fit(partial, epochs=2, steps_per_epoch=3, validation_data=Batches(), shuffle=False, verbose=0)
partial_calls = partial.calls
distributed.evaluate(Batches(), steps=3, verbose=0)
distributed.predict(Batches(), steps=1, verbose=0)
stop = keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: setattr(distributed, "stop_training", batch == 2))
distributed.fit(Batches(), epochs=3, callbacks=[stop], verbose=0)
report("py_dataset_partial_passes", calls=partial_calls, finished=True)


# 3b. A PyDataset with workers: threads, and forked processes (numpy only in __getitem__, as Keras asks of
# its worker processes); each call notes its process and thread in a file.
class WorkerBatches(keras.utils.PyDataset):
    def __init__(self, log, **workers):
        super().__init__(**workers)
        self.log = log

    def __len__(self):
        return N // BATCH

    def __getitem__(self, index):
        with open(self.log, "a") as handle:
            handle.write(f"{os.getpid()} {threading.current_thread().name}\n")
        i = np.arange(index * BATCH, (index + 1) * BATCH)
        x = np.sin(i[:, None].astype(np.float32) * np.arange(1.0, 9.0, dtype=np.float32) * np.float32(0.37))
        return x, i % 3


for kind, workers in (("threads", dict(workers=2, max_queue_size=3)),
                      ("processes", dict(workers=2, use_multiprocessing=True))):
    log = os.path.join(tempfile.mkdtemp(), "calls")
    serial, distributed = model_pair()
    serial.fit(WorkerBatches(log + ".serial", **workers), epochs=EPOCHS, shuffle=False, verbose=0)
    distributed.fit(WorkerBatches(log, **workers), epochs=EPOCHS, shuffle=False, verbose=0)
    with open(log) as handle:
        callers = [line.split() for line in handle]
    report("py_dataset_" + kind, weights=relative_difference(serial.get_weights(), distributed.get_weights()),
           calls=len(callers), main_process_calls=sum(int(pid) == os.getpid() for pid, _ in callers),
           main_thread_calls=sum(thread == "MainThread" for _, thread in callers))


# 4. A Python generator of batches (consumed once; one epoch).
def generator():
    for index in range(N // BATCH):
        i = np.arange(index * BATCH, (index + 1) * BATCH)
        x, y = features(tf.constant(i[:, None]))
        yield x.numpy().reshape(BATCH, 8), y.numpy().reshape(BATCH)


serial, distributed = model_pair()
serial.fit(generator(), epochs=1, verbose=0)
distributed.fit(generator(), epochs=1, verbose=0)
report("generator", weights=relative_difference(serial.get_weights(), distributed.get_weights()))


# 5. The function form: each rank shards the samples itself (not serial's batches, by the user's choice).
def dataset_fn(context):
    per_rank = context.get_per_replica_batch_size(BATCH)
    return tf.data.Dataset.range(N).shard(context.num_input_pipelines, context.input_pipeline_id).map(
        lambda i: (i, i % 3)).batch(per_rank, drop_remainder=True)


stream = distribute_datasets_from_function(dataset_fn)
mine = np.concatenate([element[dd.DATA][0].numpy() for element in stream])
everyone = np.concatenate(tnt.allgather_object(mine))
_, distributed = model_pair()
history = distributed.fit(distribute_datasets_from_function(
    lambda c: dataset_fn(c).map(lambda i, y: (features(i[:, None])[0], y))), epochs=EPOCHS, verbose=0)
report("from_function", samples=len(mine), all_once=sorted(everyone.tolist()) == list(range(N)),
       loss_finite=bool(np.isfinite(history.history["loss"]).all()))

# 6. Order mismatch between ranks: a per-rank shuffle seed (of samples, or of whole batches after the batch),
# a pipeline equal on every rank but for its last batch, and a generator with a per-rank order.
LAST_SWAPPED = np.arange(N)
if RANK > 0:
    LAST_SWAPPED[[-1, -2]] = LAST_SWAPPED[[-2, -1]]
if SIZE > 1:
    for kind, make in (
            ("per_rank_seed", lambda: tf.data.Dataset.range(N).shuffle(N, seed=100 + RANK).map(features).batch(BATCH)),
            ("per_rank_batch_shuffle",
             lambda: tf.data.Dataset.range(N).map(features).batch(BATCH).shuffle(4, seed=100 + RANK)),
            ("last_batch_differs",
             lambda: tf.data.Dataset.from_tensor_slices(LAST_SWAPPED).map(features).batch(BATCH)),
            ("per_rank_generator", lambda: (batch for batch in list(generator())[RANK:] + list(generator())[:RANK]))):
        _, distributed = model_pair()
        try:
            distributed.fit(make(), epochs=1, verbose=0)
            report("order_mismatch_" + kind, raised=False, message="")
        except order_check.OrderMismatchError as error:
            report("order_mismatch_" + kind, raised=True, message=str(error))
    # A PyDataset shuffling itself with numpy's global generator, seeded differently per rank.
    class GlobalShuffle(Batches):
        def on_epoch_end(self):
            np.random.shuffle(self.order)

        order = np.arange(N // BATCH)

    np.random.seed(100 + RANK)
    try:
        model_pair()[1].fit(GlobalShuffle(), epochs=1, shuffle=False, verbose=0)
        report("order_mismatch_py_dataset_global_random", raised=False, message="")
    except Exception as error:  # raised in the input pipeline: TensorFlow wraps it in its own error type
        report("order_mismatch_py_dataset_global_random", raised=True, message=str(error)[-600:])
    try:
        distributed = model_pair()[1]
        tf.random.set_seed(None)  # model_pair seeded TensorFlow: a global seed makes an op-seedless shuffle seeded
        distributed.fit(tf.data.Dataset.range(N).shuffle(N).map(features).batch(BATCH), verbose=0)
        report("unseeded_shuffle", raised=False, message="")
    except ValueError as error:
        report("unseeded_shuffle", raised=True, message=str(error))
