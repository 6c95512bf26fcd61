"""Verdicts of `tnt-repro check`: each comparison of two runs, its outcome and its likely cause.

  serial vs N devices   IDENTICAL (same bits at every step), EQUIVALENT (within the
                        derived tolerance, Note [Derived tolerance]; tolerance mode
                        only) or DIVERGENT
  run-to-run            the largest device count twice with the same seed:
                        IDENTICAL or NONDETERMINISTIC
  as written            the script twice serially without the harness's seeds:
                        IDENTICAL or SEED_DEPENDENT (the script relies on a seed it
                        does not set itself)
"""
from __future__ import annotations

from repro.compare import differences, ranks_disagree
from repro.records import Record
from repro.tolerance import Tolerance

__all__ = ["PASSING", "layer_of", "equivalence", "run_to_run", "as_written", "failed_run"]

PASSING = ("IDENTICAL", "EQUIVALENT")


def layer_of(key: str) -> str:
    """The layer name in a recorder key "003:sequential/dense_1/bias"."""
    path = key.split(":", 1)[-1].split("/")
    return path[-2] if len(path) >= 2 else path[0]


def _where(step: int, key: str, difference: float, tolerance: float | None) -> dict:
    return {"step": step, "layer": layer_of(key), "variable": key.split(":", 1)[-1],
            "difference": difference, "tolerance": tolerance}


def _statistics(diffs) -> dict:
    return {"steps_compared": diffs.steps, "max_weight_difference": float(diffs.weights.max(initial=0.0)),
            "max_loss_difference": float(max((x for x in diffs.losses[1:] if x == x), default=0.0)),
            "bitwise_identical_steps": sum(all(row) for row in diffs.bitwise[1:])}


def _distributed_cause(step: int, key: str, reference: Record, other: Record, tolerance: Tolerance | None,
                       exact: bool) -> str:
    name = key.lower()
    if step == 0:
        return ("the initial weights differ: they are not initialised from a fixed seed before the model is "
                "built, or the model is built differently on different rank counts")
    if "moving_mean" in name or "moving_variance" in name:
        return ("BatchNormalization statistics: each rank normalises with its own micro-batch's statistics and "
                "updates its moving averages from them only; serial training sees the whole batch")
    if tolerance is not None and tolerance.order_sensitive:
        return ("the model treats samples by their position in the batch (Dropout or another random layer draws "
                "a mask per position): the masks differ between serial and distributed runs, seeded or not")
    if step == 1:
        losses = reference.steps[1]["step_loss"], other.steps[1]["step_loss"]
        if None not in losses and abs(losses[0] - losses[1]) > 1e-3 * max(abs(losses[0]), 1e-30):
            return ("the first step's loss already differs: the step sees other data (the data order depends on "
                    "the rank count or on an unseeded shuffle: batch with the GLOBAL batch size, seed "
                    "shuffle/list_files) or other random masks (Dropout and other random layers draw per "
                    "micro-batch, so they cannot match serial training)")
    if exact:
        return ("the summation order differs: exact mode needs the recursive_doubling allreduce, power-of-two rank "
                "counts, global batches that are multiples of the virtual micro-batch count, equal thread counts, "
                "and a model without random layers or cross-sample layers (BatchNormalization)")
    return ("differences grew beyond the measured reassociation envelope: a non-deterministic or rank-count "
            "dependent op (random layers, time- or rank-seeded values, unsorted reductions), or training "
            "so chaotic that rounding differences explode (use --mode exact to compare bit for bit)")


def equivalence(reference: Record, other: Record, devices: int, tolerance: Tolerance | None, exact: bool) -> dict:
    """Serial vs `devices` devices."""
    label = f"serial vs {devices} device{'s' if devices != 1 else ''}"
    diffs = differences(reference, other)
    verdict = {"check": label, "devices": devices, **_statistics(diffs)}
    if diffs.step_counts[0] != diffs.step_counts[1]:
        return {**verdict, "verdict": "DIVERGENT", "first_divergence": None,
                "cause": f"the runs trained a different number of steps ({diffs.step_counts[0]} serially, "
                         f"{diffs.step_counts[1]} on {devices} devices): the dataset's length depends on the rank "
                         f"count (shard or batch it by the GLOBAL batch size only; let tnt.Model split it)"}
    disagreement = ranks_disagree(other)
    if disagreement is not None:
        step, rank, key = disagreement
        return {**verdict, "verdict": "DIVERGENT", "first_divergence": _where(step, key, float("nan"), None),
                "cause": f"rank {rank} holds other weights than rank 0 from step {step} on (layer {layer_of(key)}): "
                         f"each rank must start from the same weights and apply the same update"}
    if diffs.identical:
        return {**verdict, "verdict": "IDENTICAL", "first_divergence": None, "cause": None}
    if exact or tolerance is None:
        step, key = diffs.first_bitwise_difference()
        index = diffs.keys.index(key)
        return {**verdict, "verdict": "DIVERGENT",
                "first_divergence": _where(step, key, float(diffs.weights[step, index]), 0.0),
                "cause": _distributed_cause(step, key, reference, other, tolerance, exact)}
    margin = 0.0
    for step in range(diffs.steps + 1):
        limit = tolerance.at(step)
        for index, key in enumerate(diffs.keys):
            margin = max(margin, diffs.weights[step, index] / limit if limit else 0.0)
            if diffs.weights[step, index] > limit:
                return {**verdict, "verdict": "DIVERGENT",
                        "first_divergence": _where(step, key, float(diffs.weights[step, index]), limit),
                        "cause": _distributed_cause(step, key, reference, other, tolerance, exact)}
        loss_limit = tolerance.loss_at(step)
        if step and diffs.losses[step] == diffs.losses[step] and diffs.losses[step] > loss_limit:
            return {**verdict, "verdict": "DIVERGENT",
                    "first_divergence": {"step": step, "layer": "(loss)", "variable": "loss",
                                         "difference": float(diffs.losses[step]), "tolerance": loss_limit},
                    "cause": _distributed_cause(step, diffs.keys[0], reference, other, tolerance, exact)}
    return {**verdict, "verdict": "EQUIVALENT", "first_divergence": None, "cause": None,
            "tolerance_used": round(margin, 4)}


def _pair(first: Record, second: Record, label: str, failing: str, cause_at) -> dict:
    diffs = differences(first, second)
    verdict = {"check": label, **_statistics(diffs)}
    if diffs.identical:
        return {**verdict, "verdict": "IDENTICAL", "first_divergence": None, "cause": None}
    where = diffs.first_bitwise_difference()
    if where is None:
        return {**verdict, "verdict": failing, "first_divergence": None,
                "cause": f"the runs trained {diffs.step_counts[0]} and {diffs.step_counts[1]} steps"}
    step, key = where
    index = diffs.keys.index(key)
    return {**verdict, "verdict": failing, "first_divergence": _where(step, key, float(diffs.weights[step, index]), 0.0),
            "cause": cause_at(step)}


def run_to_run(first: Record, second: Record, devices: int) -> dict:
    def cause(step):
        if step == 0:
            return "the initial weights differ between two runs with the same seeds: an initialiser draws from an " \
                   "unseeded source (np.random.default_rng(), os.urandom, time)"
        return ("two runs with the same seeds differ: a non-deterministic op or an unseeded source of randomness "
                "that global seeds do not reach (np.random.default_rng() or random.Random() without a seed, "
                "time- or pid-based seeds, tf.timestamp, deterministic=False in tf.data)")
    label = f"run-to-run ({devices} device{'s' if devices != 1 else ''} twice)"
    return {**_pair(first, second, label, "NONDETERMINISTIC", cause),
            "devices": devices}


def as_written(first: Record, second: Record) -> dict:
    def cause(step):
        if step == 0:
            return ("run as written, the script starts from different weights each time: it does not seed the "
                    "initialisers; call tarantella.determinism.set_deterministic(seed) (or "
                    "keras.utils.set_random_seed(seed)) before building the model")
        return ("run as written, the script's data order or a random layer depends on a seed it does not set: "
                "seed shuffle/list_files and random layers (Dropout(seed=...)), or set a global seed with "
                "set_deterministic(seed)")
    return {**_pair(first, second, "as written (serial twice, no harness seeds)", "SEED_DEPENDENT", cause),
            "devices": 1}


def failed_run(label: str, devices: int, role: str, message: str) -> dict:
    """A run stopped by TensorFlow's op determinism: the finding is the op itself."""
    if role == "as_written":
        return {"check": f"as written ({label})", "devices": devices, "verdict": "SEED_DEPENDENT",
                "first_divergence": None,
                "cause": f"run as written, a random op has no seed at all (TensorFlow refuses it under op "
                         f"determinism): {message}; seed it or set a global seed with set_deterministic(seed)"}
    return {"check": label, "devices": devices, "verdict": "NONDETERMINISTIC", "first_divergence": None,
            "cause": f"TensorFlow refused a non-deterministic op under op determinism: {message}"}
