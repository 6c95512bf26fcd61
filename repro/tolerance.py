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
bits): the model treats samples by their position in the batch (random layers
such as Dropout draw per-position masks). Such a script has no serial
equivalent; the tolerance then falls back to the floor and the report says why.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from repro.compare import Differences

__all__ = ["UNIT_ROUNDOFF", "SPREAD", "ORDER_SENSITIVE_LIMIT", "Tolerance", "derive"]

UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2   # 2**-24
SPREAD = 16.0
ORDER_SENSITIVE_LIMIT = math.sqrt(UNIT_ROUNDOFF)      # ~2.4e-4


@dataclasses.dataclass
class Tolerance:
    weights: np.ndarray          # [step] relative tolerance of every weight variable
    losses: np.ndarray           # [step] relative tolerance of the step's loss
    calibration_envelope: np.ndarray
    order_sensitive: bool
    how: str                     # one line for the report

    def at(self, step: int) -> float:
        return float(self.weights[min(step, len(self.weights) - 1)])

    def loss_at(self, step: int) -> float:
        return float(self.losses[min(step, len(self.losses) - 1)])

    def as_dict(self) -> dict:
        return {"how": self.how, "spread": SPREAD, "unit_roundoff": UNIT_ROUNDOFF,
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
               f"samples by position (random layers such as Dropout); tolerance = {SPREAD:g} * step * u only")
    else:
        envelope = _running_max(per_step)
        loss_envelope = _running_max(calibration.losses)
        how = (f"tolerance[step] = {SPREAD:g} * max(running max of the serial-vs-reversed-batch difference, "
               f"step * 2^-24); measured envelope after {calibration.steps} steps: {envelope[-1]:.2e} (weights), "
               f"{loss_envelope[-1]:.2e} (loss)")
    return Tolerance(SPREAD * np.maximum(envelope, floor), SPREAD * np.maximum(loss_envelope, floor),
                     envelope, bool(order_sensitive), how)
