"""Train one benchmark (bench/specs/NAME.json) until its quality target, MLPerf style.

    tarantella -n 2 -- bench/programs/train_to_target.py --benchmark mini_digits

The master rank logs `:::MLLOG` lines through MLCommons' mlperf_logging.mllog (to stdout and
--mllog; bench/mlperf/log.py) in the form the package's compliance checker accepts
(bench/mlperf/compliance.py) and ends with one `TNT_BENCH_RESULT` line: reached or not, epochs,
time to accuracy (run_start to the evaluation that reached the target) and the quality after
each evaluation. BLEU (translation) is sacrebleu's corpus BLEU.
Exit codes: 0 done (target reached or not: see the result), 2 bad input or data missing,
3 the framework is not available.
"""
from __future__ import annotations

import argparse
import sys
import time


def _parse(argv):
    parser = argparse.ArgumentParser(prog="train_to_target.py")
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--framework", choices=("tnt", "keras"), default="tnt")
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--max-epochs", type=int)
    parser.add_argument("--data-dir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mllog")
    return parser.parse_args(argv)


def _data(spec, entry, global_batch, seed, data_dir):
    """(train dataset batched by global_batch, examples per epoch, evaluation inputs)."""
    import tensorflow as tf
    if spec["dataset"] == "digits":
        from bench.data.digits import load_digits_split
        (x_train, y_train), (x_test, y_test) = load_digits_split(seed=0)
        train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                 .shuffle(len(x_train), seed=seed, reshuffle_each_iteration=True))
        return train.batch(global_batch, drop_remainder=True), len(x_train), (x_test, y_test)
    from bench.data.datasets import get_dataset_info
    from bench.data.tfds_source import tfds_dataset
    info = get_dataset_info(spec["dataset"])
    train = tfds_dataset(spec["dataset"], entry, "train", training=True, data_dir=data_dir)
    evaluation = tfds_dataset(spec["dataset"], entry, info.eval_split, training=False, data_dir=data_dir)
    train = train.shuffle(10_000, seed=seed).batch(global_batch, drop_remainder=True).prefetch(2)
    return train, info.train_examples, evaluation


def _quality(spec, entry, model, evaluation) -> float:
    import numpy as np
    if spec["quality_metric"] == "top1_accuracy":
        if isinstance(evaluation, tuple):
            x, y = evaluation
            logits = model.predict(x, batch_size=256, verbose=0)
            return float(np.mean(np.argmax(logits, -1) == y))
        correct = total = 0
        for images, labels in evaluation.batch(256):
            logits = model.predict_on_batch(images)
            correct += int(np.sum(np.argmax(logits, -1) == labels.numpy()))
            total += int(labels.shape[0])
        return correct / max(total, 1)
    from bench.data.byte_tokens import decode
    from bench.metrics.bleu import corpus_bleu
    from bench.metrics.greedy_decode import greedy_translate
    hypotheses, references = [], []
    for inputs, labels, _ in evaluation.batch(64):
        ids = greedy_translate(model, inputs["source"].numpy(), entry.sequence_length)
        hypotheses += [decode(row) for row in ids]
        references += [decode(row) for row in labels.numpy()]
    return corpus_bleu(hypotheses, references)


def _eval_samples(evaluation) -> int:
    if isinstance(evaluation, tuple):
        return len(evaluation[1])
    count = int(evaluation.cardinality())
    return count if count >= 0 else sum(1 for _ in evaluation)


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    import keras

    import tarantella as tnt
    from bench.errors import BenchUsageError
    from bench.mlperf.log import constants, make_logger
    from bench.models.registry import get_model_entry
    from bench.programs.framework import FrameworkMissing, wrap_model
    from bench.programs.result_line import format_result_line
    from bench.programs.schedule import SpecSchedule
    from bench.specs import load_spec, scaled_learning_rate

    master = tnt.is_master_rank()
    log = make_logger(args.mllog, stack_offset=2) if master else None

    def mllog(key, value=None, kind="event", **metadata):
        """kind: event (a point in time), start or end (an interval); the master rank logs."""
        if log:
            getattr(log, kind)(key, value, metadata=metadata or None)

    try:
        spec = load_spec(args.benchmark)
        entry = get_model_entry(spec["model"])
        reference = spec["reference"]
        global_batch = args.global_batch or reference["global_batch"]
        max_epochs = args.max_epochs or reference["max_epochs"]
        # Not cleared: dropping the OS page cache needs the whole machine (Note in bench/README.md, MLPerf).
        mllog(constants.CACHE_CLEAR, False)
        mllog(constants.INIT_START, kind="start")
        for key, value in ((constants.SUBMISSION_BENCHMARK, spec["name"]),
                           (constants.SUBMISSION_DIVISION, "open"),
                           (constants.SUBMISSION_ORG, "tarantella (unofficial, not an MLPerf submission)"),
                           (constants.SUBMISSION_PLATFORM, f"{tnt.get_size()} x CPU process"),
                           (constants.SUBMISSION_STATUS, "research"),
                           (constants.SEED, args.seed)):
            mllog(key, value)
        keras.utils.set_random_seed(args.seed)
        train, epoch_examples, evaluation = _data(spec, entry, global_batch, args.seed, args.data_dir)
    except BenchUsageError as error:
        print(f"train_to_target: {error}", file=sys.stderr)
        return 2
    steps_per_epoch = max(epoch_examples // global_batch, 1)
    schedule = SpecSchedule(reference, global_batch, steps_per_epoch, steps_per_epoch * max_epochs)
    if reference["optimizer"] == "adam":
        optimizer = keras.optimizers.Adam(schedule, beta_1=reference["beta_1"], beta_2=reference["beta_2"],
                                          epsilon=reference["epsilon"])
    else:
        optimizer = keras.optimizers.SGD(schedule, momentum=reference["momentum"],
                                         weight_decay=reference.get("weight_decay") or None)
    try:
        model = wrap_model(entry.build(), args.framework)
    except FrameworkMissing as error:
        print(f"train_to_target: {error}", file=sys.stderr)
        return 3
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    eval_every = reference.get("eval_every_epochs", 1)
    for key, value in ((constants.GLOBAL_BATCH_SIZE, global_batch),
                       (constants.OPT_BASE_LR, scaled_learning_rate(reference, global_batch)),
                       (constants.OPT_LR_WARMUP_EPOCHS, reference.get("warmup_epochs", 0)),
                       (constants.OPT_LR_WARMUP_STEPS, reference.get("warmup_steps", 0)),
                       (constants.TRAIN_SAMPLES, epoch_examples), (constants.EVAL_SAMPLES, _eval_samples(evaluation)),
                       ("quality_target", spec["quality_target"]), ("eval_every_epochs", eval_every),
                       ("max_epochs", max_epochs)):
        mllog(key, value)
    mllog(constants.INIT_STOP, kind="end")
    tnt.barrier()
    mllog(constants.RUN_START, kind="start")
    started = time.perf_counter()
    history, reached, epochs = [], None, 0
    for epoch in range(max_epochs):
        epochs = epoch + 1
        mllog(constants.EPOCH_START, epoch + 1, kind="start", epoch_num=epoch + 1)
        model.fit(train, epochs=epoch + 1, initial_epoch=epoch, verbose=0, shuffle=False)
        mllog(constants.EPOCH_STOP, epoch + 1, kind="end", epoch_num=epoch + 1)
        if (epoch + 1) % eval_every and epoch + 1 < max_epochs:
            continue
        mllog(constants.EVAL_START, epoch + 1, kind="start", epoch_num=epoch + 1)
        quality = _quality(spec, entry, model, evaluation)
        history.append({"epoch": epoch + 1, "quality": quality, "seconds": time.perf_counter() - started})
        mllog(constants.EVAL_ACCURACY, quality, epoch_num=epoch + 1)
        mllog(constants.EVAL_STOP, epoch + 1, kind="end", epoch_num=epoch + 1)
        if quality >= spec["quality_target"]:
            reached = time.perf_counter() - started
            break
    mllog(constants.RUN_STOP, kind="end", status="success" if reached is not None else "aborted")
    if master:
        print(format_result_line({
            "benchmark": spec["name"], "model": entry.name, "framework": args.framework,
            "ranks": tnt.get_size(), "global_batch": global_batch, "quality_metric": spec["quality_metric"],
            "quality_target": spec["quality_target"], "reached": reached is not None,
            "time_to_target_s": reached, "epochs": epochs, "evaluations": history,
            "run_s": time.perf_counter() - started}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
