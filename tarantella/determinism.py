"""Deterministic set-up of a training process: seeds, TF op determinism, thread counts.

    from tarantella.determinism import set_deterministic
    set_deterministic(42)          # first thing in the script, before any model or dataset

covers the reproducibility requirements of the original Tarantella (seed
`tf.random`, Python `random`, numpy and PYTHONHASHSEED; deterministic TF ops)
and one it left implicit: the same thread counts in serial and distributed runs
(Note [Thread counts]). The per-op requirements (seeded Dropout, seeded
`shuffle`/`list_files`, `deterministic=True` in `map`/`interleave`) cannot be
set from here; `tnt-repro lint` finds them.

The harness (`tnt-repro check`) applies the same set-up from outside: it puts
`environment(seed)` into each rank's environment and its runner calls
`apply_from_environment()` before the user's script starts, so a script that
never calls set_deterministic is still run deterministically.

Note [Thread counts]
The launcher gives every rank CPUs // ranks intra-op threads, so by default a
serial run and a 4-rank run split their reductions (Eigen, oneDNN) over
different numbers of threads, i.e. in different orders. Deterministic runs use
one intra-op thread everywhere. Inter-op threads are 2 (also where the launcher
would give a rank with one CPU one: Note [Thread defaults] in
tarantella/launcher/rank_wrapper.py): they only schedule ops and do not change
any op's arithmetic.

Note [PYTHONHASHSEED]
Python reads PYTHONHASHSEED once, at interpreter start, so setting it inside a
script only fixes `hash()` of str/bytes for the processes it starts. The
harness sets it in each rank's environment; set_deterministic sets it for
child processes and reports whether this process itself was started with it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random

__all__ = ["SEED_VARIABLE", "environment", "set_deterministic", "apply_from_environment", "fix_ops_and_threads",
           "DeterministicSetup", "DEFAULT_INTRA_OP_THREADS", "DEFAULT_INTER_OP_THREADS"]

SEED_VARIABLE = "TNT_DETERMINISTIC_SEED"
DEFAULT_INTRA_OP_THREADS = 1
DEFAULT_INTER_OP_THREADS = 2

logger = logging.getLogger("tarantella")


def environment(seed: int, intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
                inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> dict[str, str]:
    """The environment variables of a deterministic process (set them before it starts)."""
    _check_seed(seed)
    return {
        SEED_VARIABLE: str(seed),
        "PYTHONHASHSEED": str(seed),
        "TF_DETERMINISTIC_OPS": "1",
        "TF_CUDNN_DETERMINISTIC": "1",
        "TF_NUM_INTRAOP_THREADS": str(intra_op_threads),
        "TF_NUM_INTEROP_THREADS": str(inter_op_threads),
        "OMP_NUM_THREADS": str(intra_op_threads),
    }


@dataclasses.dataclass(frozen=True)
class DeterministicSetup:
    """What set_deterministic did, for logs and reports."""
    seed: int
    intra_op_threads: int
    inter_op_threads: int
    threads_applied: bool          # False: TensorFlow had started with other counts (set them earlier)
    hash_seed_effective: bool      # this process was started with PYTHONHASHSEED=seed (Note [PYTHONHASHSEED])


def set_deterministic(seed: int, intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
                      inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> DeterministicSetup:
    """Seed Python, numpy, TensorFlow and Keras with `seed`, make TF ops
    deterministic and fix the thread counts. Call it first in the script, on every rank."""
    _check_seed(seed)
    hash_seed_effective = os.environ.get("PYTHONHASHSEED") == str(seed)
    os.environ.update(environment(seed, intra_op_threads, inter_op_threads))
    random.seed(seed)
    import numpy as np
    np.random.seed(seed)
    threads_applied = fix_ops_and_threads(intra_op_threads, inter_op_threads)
    import keras
    keras.utils.set_random_seed(seed)  # Python, numpy, tf.random and Keras's own seed generator
    setup = DeterministicSetup(seed, intra_op_threads, inter_op_threads, threads_applied, hash_seed_effective)
    logger.info("tarantella: deterministic set-up %s", setup)
    return setup


def fix_ops_and_threads(intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
                        inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> bool:
    """The seed-free half of set_deterministic: deterministic TF ops and fixed thread
    counts. True when the thread counts could be applied (Note [Thread counts])."""
    import tensorflow as tf
    applied = _set_thread_counts(tf, intra_op_threads, inter_op_threads)
    tf.config.experimental.enable_op_determinism()
    return applied


def apply_from_environment() -> DeterministicSetup | None:
    """set_deterministic with the seed and thread counts of the environment
    (as `environment()` made them); None when TNT_DETERMINISTIC_SEED is unset."""
    raw = os.environ.get(SEED_VARIABLE)
    if raw is None:
        return None
    try:
        seed = int(raw)
    except ValueError:
        raise ValueError(f"tarantella: {SEED_VARIABLE}={raw!r} is not a whole number; "
                         f"set it to the seed of the deterministic run, e.g. 42") from None
    return set_deterministic(seed,
                             int(os.environ.get("TF_NUM_INTRAOP_THREADS", DEFAULT_INTRA_OP_THREADS)),
                             int(os.environ.get("TF_NUM_INTEROP_THREADS", DEFAULT_INTER_OP_THREADS)))


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"tarantella: the seed must be a whole number in [0, 2**32), got {seed!r}")


def _set_thread_counts(tf, intra: int, inter: int) -> bool:
    """True when TensorFlow runs with these counts (Note [Thread counts])."""
    threading = tf.config.threading
    if (threading.get_intra_op_parallelism_threads() == intra
            and threading.get_inter_op_parallelism_threads() == inter):
        return True
    try:
        threading.set_intra_op_parallelism_threads(intra)
        threading.set_inter_op_parallelism_threads(inter)
        return True
    except RuntimeError:
        logger.warning("tarantella: TensorFlow already started with %d intra-op / %d inter-op threads; "
                       "call set_deterministic before building any model or tensor (or start the process "
                       "with TF_NUM_INTRAOP_THREADS=%d TF_NUM_INTEROP_THREADS=%d) so that every run uses the "
                       "same thread counts", threading.get_intra_op_parallelism_threads(),
                       threading.get_inter_op_parallelism_threads(), intra, inter)
        return False
