"""Verdicts of `tnt-repro check`: each comparison of two runs, its outcome and its likely cause.

  serial vs N devices   IDENTICAL (same bits at every step), EQUIVALENT (within the
                        derived tolerance, Note [Derived tolerance]; tolerance mode
                        only) or DIVERGENT
  run-to-run            the largest device count twice with the same seed:
                        IDENTICAL or NONDETERMINISTIC
  as written            the script twice serially without the harness's seeds:
                        IDENTICAL or SEED_DEPENDENT (the script relies on a seed it
                        does not set itself)
  N devices             NOT DISTRIBUTED instead of the serial comparison when the run had
                        more than one rank but the engine performed no gradient reduction
                        (Note [Refusing runs that distributed nothing] in
                        tarantella/_repro/reductions.py)
                        UNDECIDED instead when the calibration exceeded the cap and the run
                        differs by more than the cap but less than the uncapped tolerance
                        (Note [Undecided] in repro/tolerance.py): not passing, not failing
  exact serial vs       exact mode only: the exact train step's serial run against the
  production serial     production train step's serial run, within the measured tolerance:
                        IDENTICAL, EQUIVALENT or DIVERGENT
Every comparison says what it compared (`compared`: tensors, elements, steps, ranks).
"""
from __future__ import annotations

import math

from repro import precision
from repro.compare import differences, ranks_disagree, scope
from repro.records import Record
from repro.tolerance import Tolerance

__all__ = ["PASSING", "NOT_COMPARED", "UNDECIDED", "WRAP_FIX", "ghost_batches_not_compared", "layer_of",
           "equivalence", "run_to_run", "as_written", "failed_run", "not_distributed"]

WRAP_FIX = ("wrap the model for training: `import tarantella as tnt` and `model = tnt.Model(model)` before "
            "compile/fit; or check the script unmodified with `tnt-repro check --wrap ...`, which trains its "
            "keras.Model through tnt.Model")

NOT_COMPARED = "NOT COMPARED"  # a comparison that would measure a documented difference of design, not a defect
PASSING = ("IDENTICAL", "EQUIVALENT", NOT_COMPARED)
UNDECIDED = "UNDECIDED"        # neither evidence for nor against the run (Note [Undecided] in repro/tolerance.py)

_LOCAL_BATCH_NORM = ("tnt.Model(..., batch_norm=\"local\"): each rank normalises with its own micro-batch's "
                     "statistics and updates its moving averages from them; drop batch_norm=\"local\" for "
                     "BatchNormalization over the global batch, as serial Keras")

_PIPELINE_BATCH_NORM = ("pipelining normalises each micro-batch with its own statistics (taken over the stage's "
                        "replicas), as GPipe does: BatchNormalization sees B/M samples where serial Keras sees B, "
                        "and its moving statistics take M steps per batch (Note [A pipeline's micro-batches and "
                        "the layers that look at the batch]); num_micro_batches=1 gives serial's statistics")


def layer_of(key: str) -> str:
    """The layer name in a recorder key "003:sequential/dense_1/bias"."""
    path = key.split(":", 1)[-1].split("/")
    return path[-2] if len(path) >= 2 else path[0]


def _where(step: int, key: str, difference: float, tolerance: float | None) -> dict:
    return {"step": step, "layer": layer_of(key), "variable": key.split(":", 1)[-1],
            "difference": difference, "tolerance": tolerance}


def _largest(values) -> float | None:
    finite_or_inf = [float(x) for x in values.ravel() if x == x]
    return max(finite_or_inf, default=0.0) if len(finite_or_inf) == values.size else None


def _statistics(diffs) -> dict:
    return {"steps_compared": diffs.steps, "max_weight_difference": _largest(diffs.weights),
            "max_abs_weight_difference": _largest(diffs.absolute),
            "max_loss_difference": float(max((x for x in diffs.losses[1:] if x == x), default=0.0)),
            "bitwise_identical_steps": sum(all(row) for row in diffs.bitwise[1:])}


def _distributed_cause(step: int, key: str, reference: Record, other: Record, tolerance: Tolerance | None,
                       exact: bool) -> str:
    name = key.lower()
    if step == 0:
        return ("the initial weights differ: they are not initialised from a fixed seed before the model is "
                "built, or the model is built differently on different rank counts")
    if other.unmatched_random_ops:
        return (f"random ops whose values tarantella cannot make serial's draw per rank: "
                f"{', '.join(other.unmatched_random_ops[:3])} (Note [Random values by sample, not by rank]; draw "
                f"with keras.random or tf.random.stateless_* instead)")
    if other.batch_norm == "local":
        return _LOCAL_BATCH_NORM
    if other.strategy.startswith("pipelining") and other.batch_norm_layers:
        return _PIPELINE_BATCH_NORM
    if exact and ("moving_mean" in name or "moving_variance" in name):
        return ("the moving statistics differ in exact mode, which takes one moving-average step per global "
                "batch from the virtual micro-batches' moments summed in the fixed tree (Note "
                "[BatchNormalization in exact mode]): a layer with renorm=True, or a rank count or allreduce "
                "that is not exact mode's")
    if tolerance is not None and tolerance.order_sensitive:
        return ("the model treats samples by their position in the batch in a way serial semantics cannot follow "
                "(a layer reading row indices, random values not drawn per sample): reversing a batch in the "
                "calibration already changed the weights beyond rounding")
    if step == 1:
        losses = reference.steps[1]["step_loss"], other.steps[1]["step_loss"]
        if None not in losses and abs(losses[0] - losses[1]) > 1e-3 * max(abs(losses[0]), 1e-30):
            return ("the first step's loss already differs: the step sees other data (the data order depends on "
                    "the rank count or on an unseeded shuffle: batch with the GLOBAL batch size, seed "
                    "shuffle/list_files) or other random values (a random op tarantella cannot draw per sample, "
                    "Note [Random values by sample, not by rank])")
    if exact:
        return ("the summation order differs: exact mode needs the recursive_doubling allreduce, power-of-two rank "
                "counts, global batches that are multiples of the virtual micro-batch count and equal thread "
                "counts")
    return ("differences grew beyond the measured reassociation envelope: a non-deterministic or rank-count "
            "dependent op (random layers, time- or rank-seeded values, unsorted reductions), or training "
            "so chaotic that rounding differences explode (use --mode exact to compare bit for bit)")


def ghost_batches_not_compared(reference: Record, label: str) -> dict:
    """Exact serial against production serial for a model with BatchNormalization: they normalise different
    batches by design (Note [BatchNormalization in exact mode]), so their distance measures nothing."""
    return {"check": label, "devices": 1, "verdict": NOT_COMPARED, "first_divergence": None,
            "cause": (f"the model has {reference.batch_norm_layers} BatchNormalization layer"
                      f"{'s' if reference.batch_norm_layers != 1 else ''}: exact mode normalises each virtual "
                      f"micro-batch with its own statistics (ghost batches), production with the global batch's "
                      f"(Note [BatchNormalization in exact mode]); tolerance mode compares production runs")}


def not_distributed(record: Record, devices: int) -> dict | None:
    """The verdict NOT DISTRIBUTED for a run on several ranks that reduced no gradient; None otherwise."""
    if record.world_size <= 1 or record.gradient_reductions is None or record.gradient_reductions > 0:
        return None
    return {"check": f"serial vs {devices} device{'s' if devices != 1 else ''}", "devices": devices,
            "verdict": "NOT DISTRIBUTED", "first_divergence": None, "world_size": record.world_size,
            "strategy": record.strategy, "gradient_reductions": record.gradient_reductions,
            "cause": f"{record.world_size} ranks ran but the engine performed no gradient reduction (model: "
                     f"{record.strategy}): every rank trained alone on the whole data set, so the weights "
                     f"match serial training without anything being distributed",
            "fix": WRAP_FIX}


def equivalence(reference: Record, other: Record, devices: int, tolerance: Tolerance | None, exact: bool,
                label: str | None = None) -> dict:
    """Serial vs `devices` devices (or, with `label`, any run against the reference it was compared with)."""
    label = label or f"serial vs {devices} device{'s' if devices != 1 else ''}"
    diffs = differences(reference, other)
    verdict = {"check": label, "devices": devices, "compared": scope(reference, other, diffs),
               "gradient_reductions": other.gradient_reductions, "world_size": other.world_size,
               "strategy": other.strategy, **_statistics(diffs)}
    if diffs.step_counts[0] != diffs.step_counts[1]:
        return {**verdict, "verdict": "DIVERGENT", "first_divergence": None,
                "cause": f"the runs trained a different number of steps ({diffs.step_counts[0]} serially, "
                         f"{diffs.step_counts[1]} on {devices} devices): the dataset's length depends on the rank "
                         f"count (shard or batch it by the GLOBAL batch size only; let tnt.Model split it)"}
    disagreement = ranks_disagree(other)
    if disagreement is not None:
        step, rank, key = disagreement
        why = ("each rank must start from the same weights and apply the same update" if other.batch_norm != "local"
               else _LOCAL_BATCH_NORM)
        return {**verdict, "verdict": "DIVERGENT", "first_divergence": _where(step, key, float("nan"), None),
                "cause": f"rank {rank} holds other weights than rank 0 from step {step} on (layer {layer_of(key)}): "
                         f"{why}"}
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
            gap = float(diffs.weights[step, index])
            margin = max(margin, gap / limit if limit and math.isfinite(gap) else 0.0)
            if not gap <= limit:  # nan (no size) and inf fail too
                where = _where(step, key, gap, limit)
                if gap <= tolerance.undecided_up_to(step):
                    return _undecided(verdict, where, tolerance)
                return {**verdict, "verdict": "DIVERGENT", "first_divergence": where,
                        "cause": _distributed_cause(step, key, reference, other, tolerance, exact)}
        loss_limit = tolerance.loss_at(step)
        if step and diffs.losses[step] == diffs.losses[step] and diffs.losses[step] > loss_limit:
            where = {"step": step, "layer": "(loss)", "variable": "loss", "difference": float(diffs.losses[step]),
                     "tolerance": loss_limit}
            if diffs.losses[step] <= tolerance.undecided_up_to(step, loss=True):
                return _undecided(verdict, where, tolerance)
            return {**verdict, "verdict": "DIVERGENT", "first_divergence": where,
                    "cause": _distributed_cause(step, diffs.keys[0], reference, other, tolerance, exact)}
    cause = None
    if tolerance.low_precision:  # Note [Tolerance from the compute dtype]
        cause = (f"the runs differ by {tolerance.compute_dtype} rounding of sums over another split of the batch "
                 f"(the model computes in {precision.describe(tolerance.compute_dtype)}), within that dtype's "
                 f"tolerance; not by the samples' positions")
    return {**verdict, "verdict": "EQUIVALENT", "first_divergence": None, "cause": cause,
            "tolerance_used": round(margin, 4)}


def _undecided(verdict: dict, where: dict, tolerance: Tolerance) -> dict:
    step = where["step"]
    return {**verdict, "verdict": UNDECIDED, "first_divergence": where,
            "cause": (f"at step {step} the runs differ by {where['difference']:.2e} ({where['variable']}): beyond "
                      f"the cap {tolerance.cap:.2e}, but within what reversing the samples of a batch alone moved "
                      f"the serial run ({tolerance.spread:g} x the calibration: "
                      f"{tolerance.undecided_up_to(step, where['layer'] == '(loss)'):.2e}), so rounding may explain "
                      f"it and a defect too (Note [Undecided] in repro/tolerance.py)"),
            "fix": "decide it bit for bit with --mode exact, or compare fewer steps (--steps)"}


def _pair(first: Record, second: Record, label: str, failing: str, cause_at) -> dict:
    diffs = differences(first, second)
    verdict = {"check": label, "compared": scope(first, second, diffs), **_statistics(diffs)}
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


def as_written(first: Record, second: Record, tolerance: Tolerance | None = None) -> dict:
    """SEED_DEPENDENT when the two unseeded serial runs differ; NONDETERMINISTIC instead when they start alike
    and stay within the measured reassociation tolerance: differences at the rounding level come from a
    kernel's summation order, not from a seed (a missing seed changes masks, orders or initial weights)."""
    verdict = _as_written_pair(first, second)
    where = verdict.get("first_divergence")
    largest = verdict.get("max_weight_difference")
    if (verdict["verdict"] == "SEED_DEPENDENT" and tolerance is not None and where and where["step"] > 0
            and largest is not None and largest <= tolerance.at(first.step_count)):
        return {**verdict, "verdict": "NONDETERMINISTIC",
                "cause": (f"two serial runs of the script as written, which seeds itself (their initial weights are "
                          f"identical), differ only at the rounding level (at most {largest:.3g} relative, within "
                          f"the reassociation tolerance {tolerance.at(first.step_count):.3g}) from step "
                          f"{where['step']}: an op whose summation order varies from run to run, which op "
                          f"determinism does not fix; not a missing seed")}
    return verdict


def _as_written_pair(first: Record, second: Record) -> dict:
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
