"""The shared launches of the suite (tests/shared_launch.py): test programs that train and are expected to
succeed, one launch per group and rank count, so that the ranks import TensorFlow and start the engine once
for all of them. Each test still names its program and rank count and reads that program's output alone.
A program joins a group whose environment it can run in; programs that fail on purpose, kill ranks, need
launcher flags or an environment of their own keep run_ranks."""
import os

from tests.multirank import REPO_ROOT
from tests.shared_launch import Program, SharedLaunch

TESTS = os.path.dirname(os.path.abspath(__file__))


def _program(name, directory, file, ranks, timeout, args=()):
    return Program(name, os.path.join(TESTS, directory, "programs", file), args=args, ranks=ranks, timeout=timeout)


# Data parallelism against serial Keras: tests/data, tests/keras.
TRAINING = SharedLaunch(env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}, programs=[
    _program("input_kinds", "data", "input_kinds.py", (1, 2), 400),
    _program("step_structure", "data", "step_structure.py", (1, 2, 3), 400),
    _program("fit_matches_serial", "keras", "fit_matches_serial.py", (1, 2, 3, 4), 400),
    _program("batch_layers", "keras", "batch_layers.py", (1, 2, 3), 500),
    _program("own_training_logic", "keras", "own_training_logic.py", (1, 2), 400),
    _program("keras_fidelity", "keras", "keras_fidelity.py", (2,), 400),
    _program("sparse_optimizers", "keras", "sparse_optimizers.py", (2,), 400),
    _program("metrics_with_gradients", "keras", "metrics_with_gradients.py", (1, 2), 300),
    _program("keras_io_zoo", "keras", "keras_io_zoo.py", (2,), 400, args=("--floatx", "float64")),
    _program("loss_scale", "keras", "loss_scale.py", (2, 4), 180),
    _program("sharded_optimizer", "keras", "sharded_optimizer.py", (1, 2, 4), 380),
    _program("sharded_weights", "keras", "sharded_weights.py", (1, 2, 4), 280),
    _program("stage3_arithmetic", "keras", "stage3_arithmetic.py", (2,), 200),
    _program("manual_blocks", "docs", "manual_blocks.py", (1, 2), 300),
    # last: set_deterministic fixes the thread counts when TensorFlow has not started yet
    Program("custom_loop", os.path.join(REPO_ROOT, "examples", "custom_loop.py"), args=("--check",), ranks=(1, 2),
            timeout=170),
])


# Pipelines against serial Keras: tests/pipeline. oneDNN's graph rewrites fuse ops differently in a stage's
# graph than in the whole model's (the fused kernels round differently), and Adam amplifies that rounding:
# measured, 2 stages at M = 1 are bit-identical to serial Keras without them and differ by ~1e-5 relative with
# them. Without them the 1e-5 comparisons check the pipeline's logic, with only micro-batching's own rounding.
PIPELINE = SharedLaunch(env={"TNT_TIMEOUT_SECONDS": "60", "TF_ENABLE_ONEDNN_OPTS": "0"}, programs=[
    _program("2-stages-deterministic", "pipeline", "check_against_serial.py", (2,), 220,
             args=("2", "--save={scratch}", "--deterministic")),
    _program("2-stages-x-2-replicas-deterministic", "pipeline", "check_against_serial.py", (4,), 220,
             args=("2", "--data-parallel", "--deterministic")),
    _program("4-stages", "pipeline", "check_against_serial.py", (4,), 220, args=("4", "--save={scratch}")),
    _program("errors_and_auto_cut", "pipeline", "check_errors_and_auto_cut.py", (2,), 130),
    _program("stage_state", "pipeline", "check_stage_state.py", (2,), 220, args=("{scratch}",)),
    _program("wide_micro_batches", "pipeline", "wide_micro_batches.py", (2,), 220),
    _program("batch_layers", "pipeline", "check_batch_layers.py", (2, 4), 220),
])
