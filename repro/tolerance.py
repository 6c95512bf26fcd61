"""The tolerance of the serial-vs-distributed comparison, derived from a measurement.

Note [Derived tolerance]
Distributed training differs from serial training (beyond bugs) only in the
order in which the batch's per-sample contributions are added: each rank sums
its micro-batch, the allreduce sums the ranks. How far such a reassociation
carries through training depends on the model, the optimizer, the data and the
step count, so no fixed constant fits. The harness measures it instead: the
calibration run is the serial run with every batch's samples reversed
(Note [Measured tolerance] in repro/calibration_step.py), a reassociation of
the very same sums. With C[s, v] the relative difference between the serial run
and the calibration run at step s for variable v:

    envelope[s]  = max over steps s' <= s and all variables of C[s', v]
    tolerance[s] = SPREAD * max(envelope[s], s * u)

u is float32's unit roundoff 2**-24 (the floor keeps a tolerance when the
calibration happens to round to the same bits). SPREAD = 16 (4 bits of
headroom) allows for one reassociation carrying the trajectory further than
another: on the project's examples the distributed runs' differences were
0.6-1.8 times the calibration envelope (they use 5-11% of the tolerance), while
a planted unseeded noise source differed by 6e-4 at its first step, ~300 times
the tolerance there (results/repro/README.md has the figures). A run is
EQUIVALENT when every variable and loss at every step is within tolerance.

If the calibration already differs by more than sqrt(u) after one step, the
difference cannot be rounding (one step of reassociation moves the last few
bits): the model treats samples by their position in the batch in a way the
calibration cannot undo (Keras's random layers it can: their draws are reversed
with the batch, Note [Measured tolerance]; a stateful random op or a layer
reading row indices it cannot). The tolerance then falls back to the floor and
the report says why.

Note [Tolerance cap]
The tolerance never exceeds CAP = 2**-12 (~2.4e-4) relative to the largest weight of a
variable, whatever the calibration measured and however many steps ran (the floor s * u
alone reaches it after 256 steps). At that size half of float32's 24 significand bits of
the largest weight differ: rounding in a stable training stays far below (the project's
examples: 3.8e-7 and 5.2e-7 after 30 steps), while real bugs are of that size (the planted
unseeded noise source: 6e-4 at its first step). A tolerance wider than the cap could not tell
the two apart. A calibration whose derived tolerance would exceed the cap (a training that
amplifies rounding so much: chaotic dynamics, too many steps, too high a learning rate) is not
widened into a loose check: the tolerance stays capped and the check reports the calibration
itself as the failing verdict CALIBRATION_EXCEEDS_CAP, naming the step where it crossed the cap
(fix: fewer --steps, or --mode exact, which needs no tolerance).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from repro.compare import Differences

__all__ = ["UNIT_ROUNDOFF", "SPREAD", "ORDER_SENSITIVE_LIMIT", "CAP", "Tolerance", "derive"]

UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2   # 2**-24
SPREAD = 16.0
ORDER_SENSITIVE_LIMIT = math.sqrt(UNIT_ROUNDOFF)      # ~2.4e-4
CAP = 2.0 ** -12                                      # Note [Tolerance cap]; equals sqrt(u)


@dataclasses.dataclass
class Tolerance:
    weights: np.ndarray          # [step] relative tolerance of every weight variable
    losses: np.ndarray           # [step] relative tolerance of the step's loss
    calibration_envelope: np.ndarray
    order_sensitive: bool
    how: str                     # one line for the report
    exceeded_cap_at: int | None = None   # first step where the derived tolerance would exceed CAP
    uncapped_maximum: float = 0.0        # the largest derived tolerance before capping

    def at(self, step: int) -> float:
        return float(self.weights[min(step, len(self.weights) - 1)])

    def loss_at(self, step: int) -> float:
        return float(self.losses[min(step, len(self.losses) - 1)])

    def as_dict(self) -> dict:
        return {"how": self.how, "spread": SPREAD, "unit_roundoff": UNIT_ROUNDOFF, "cap": CAP,
                "exceeded_cap_at": self.exceeded_cap_at, "uncapped_maximum": self.uncapped_maximum,
                "order_sensitive": self.order_sensitive,
                "order_sensitive_limit": ORDER_SENSITIVE_LIMIT,
                "calibration_envelope": self.calibration_envelope.tolist(),
                "weight_tolerance": self.weights.tolist(), "loss_tolerance": self.losses.tolist()}


def _running_max(values: np.ndarray) -> np.ndarray:
    return np.maximum.accumulate(np.nan_to_num(values, nan=0.0))


def derive(calibration: Differences) -> Tolerance:
    """The tolerance per step from the serial-vs-calibration differences."""
    steps = np.arange(calibration.steps + 1, dtype=np.float64)
    floor = steps * UNIT_ROUNDOFF
    per_step = calibration.weights.max(axis=1) if calibration.weights.size else np.zeros(len(steps))
    order_sensitive = calibration.steps >= 1 and float(per_step[1]) > ORDER_SENSITIVE_LIMIT
    if order_sensitive:
        envelope = np.zeros(len(steps))
        loss_envelope = np.zeros(len(steps))
        how = (f"calibration invalid: reversing the samples of a batch changed the weights by "
               f"{per_step[1]:.2e} (> sqrt(u) = {ORDER_SENSITIVE_LIMIT:.1e}) after one step, so the model treats "
               f"samples by position (random values not drawn per sample, row indices); tolerance = {SPREAD:g} * step "
               f"* u only")
    else:
        envelope = _running_max(per_step)
        loss_envelope = _running_max(calibration.losses)
        how = (f"tolerance[step] = {SPREAD:g} * max(running max of the serial-vs-reversed-batch difference, "
               f"step * 2^-24); measured envelope after {calibration.steps} steps: {envelope[-1]:.2e} (weights), "
               f"{loss_envelope[-1]:.2e} (loss)")
    uncapped = SPREAD * np.maximum(envelope, floor)
    exceeded = np.flatnonzero(SPREAD * envelope > CAP)
    exceeded_at = int(exceeded[0]) if exceeded.size else None
    if exceeded_at is not None:
        how = (f"calibration exceeds the cap: the serial-vs-reversed-batch difference reached "
               f"{envelope[exceeded_at]:.2e} at step {exceeded_at} ({SPREAD:g} x that > cap {CAP:.2e}; "
               f"at the end {envelope[-1]:.2e}); tolerance capped at {CAP:.2e}, not widened")
    else:
        how += f"; capped at {CAP:.2e} (Note [Tolerance cap])"
    return Tolerance(np.minimum(uncapped, CAP), np.minimum(SPREAD * np.maximum(loss_envelope, floor), CAP),
                     envelope, bool(order_sensitive), how, exceeded_at, float(uncapped.max(initial=0.0)))
