"""Pipelined training against serial Keras on 2 and 4 ranks: 2 stages, 2 stages
x 2 replicas, 4 stages; both schedules in every launch. A hang fails the test
(the engine's timeout, then run_ranks' kill), it never stalls."""
import os

import pytest

from tests.launches import PIPELINE
from tests.multirank import run_ranks

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs")
# The programs run in PIPELINE's environment (tests/launches.py), oneDNN's graph rewrites off.
TRAINING_CHECKS = [f"{name} {check}" for name in ("1f1b", "1f1b with deferred weight gradients", "gpipe")
                   for check in ("training matches serial", "evaluate and predict match serial")] + ["done"]


def check_all_ranks(result, ranks, checks):
    result.assert_printed(checks, range(ranks))


def _against_serial(name, ranks, saves, marks=()):
    """PIPELINE's program `name`: check_against_serial.py with STAGES [--save=DIR] [--data-parallel]
    [--deterministic] (tests/launches.py)."""
    return pytest.param(name, ranks, saves, marks=[*PIPELINE.marks(name), *marks], id=name)


@pytest.mark.parametrize("name,ranks,saves", [_against_serial("2-stages-deterministic", 2, True),
                                              _against_serial("2-stages-x-2-replicas-deterministic", 4, False),
                                              _against_serial("4-stages", 4, True, [pytest.mark.extended])])
def test_pipelined_training_matches_serial_keras(name, ranks, saves):
    result = PIPELINE.run(name, ranks).check()
    checks = TRAINING_CHECKS + (["save writes one keras file; load_model pipelines it"] if saves else [])
    check_all_ranks(result, ranks, checks)


@PIPELINE.test("errors_and_auto_cut")
def test_bad_pipelines_fail_early_and_automatic_cuts_train_like_serial():
    result = PIPELINE.run("errors_and_auto_cut", 2).check()
    check_all_ranks(result, 2, ["stage count must divide the ranks", "inputs on the first stage",
                                "splits and stage count agree", "automatic cut by time trains like serial",
                                "automatic cut by parameters trains like serial",
                                "default micro-batch count trains like serial",
                                "logs the step cannot carry reach every rank like serial's", "done"])
    assert "automatic pipeline cut into 2 stages" in result.rank_stdout[0], result.describe()


@PIPELINE.test("stage_state")
def test_ranks_hold_only_their_stage_and_keep_the_whole_models_semantics():
    result = PIPELINE.run("stage_state", 2).check()
    check_all_ranks(result, 2, ["each rank holds only its stage's weights and optimizer state",
                                "global_clipnorm, regularizers, add_loss and class_weight train like serial",
                                "a LossScaleOptimizer takes one decision for all stages",
                                "save gathers the whole model and optimizer; load_model resumes training",
                                "a model built in deferred_weights() materialises only the rank's stage and "
                                "trains like serial",
                                "micro-batches must divide the batch", "done"])


@PIPELINE.test("wide_micro_batches")
def test_the_benchmarks_shape_trains_as_serial_and_bitwise_as_keras_adam():
    """16-row micro-batches (the input gradient's other form) and Adam in one pass, under op determinism."""
    result = PIPELINE.run("wide_micro_batches", 2).check()
    check_all_ranks(result, 2, ["Adam in one pass gives Keras's own update's weights to the bit",
                                "run to run the same bits", "16-row micro-batches train as serial Keras", "done"])


@PIPELINE.test("batch_layers")
@pytest.mark.parametrize("ranks", [2, 4], ids=["2-stages", "2-stages-x-2-replicas"])
def test_layers_that_look_at_the_batch_follow_serial_per_micro_batch(ranks):
    """Issue 19 §1-2: each micro-batch draws serial's random values; BatchNormalization shares each
    micro-batch's statistics over the stage's replicas (serial's at one micro-batch)."""
    result = PIPELINE.run("batch_layers", ranks).check()
    check_all_ranks(result, ranks, ["1f1b: random layers draw serial's values per micro-batch",
                                    "gpipe: random layers draw serial's values per micro-batch",
                                    "one micro-batch: BatchNormalization over the replicas is serial's",
                                    "four micro-batches: the replicas share each micro-batch's statistics", "done"])


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_replicas_of_a_stage_share_its_optimizer_state_and_train_as_unsharded():
    """Issue 21: shard="optimizer" with ParallelStrategy.ALL (2 stages x 2 replicas), under op determinism."""
    result = run_ranks(4, os.path.join(PROGRAMS, "sharded_replicas.py"), timeout=280,
                       env={"TNT_TIMEOUT_SECONDS": "60"}).check()
    for set_up in ("SGD with momentum", "AdamW excluding biases from decay", "Adam with global_clipnorm",
                   "RMSprop with a schedule and EMA", "LossScaleOptimizer(Adam, global_clipnorm)"):
        for rank in range(4):
            assert f"OK {set_up}: bitwise unsharded;" in result.rank_stdout.get(rank, ""), result.describe()
    check_all_ranks(result, 4, ["each rank keeps the optimizer state of its share of its stage",
                                "save writes the whole optimizer state, equal to the unsharded pipeline's",
                                "load_model resumes sharded from either file as the unsharded pipeline does",
                                "stages 2 and 3 are refused with pipelining in one line", "done"])
