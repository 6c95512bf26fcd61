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

u is the unit roundoff of the dtype the model computes in (float32's 2**-24,
bfloat16's 2**-8 under mixed_bfloat16: Note [Tolerance from the compute dtype]
in repro/precision.py); the floor keeps a tolerance when the calibration happens
to round to the same bits. SPREAD = 16 (4 bits of
headroom) allows for one reassociation carrying the trajectory further than
another: on the project's examples the distributed runs' differences were
0.6-1.8 times the calibration envelope (they use 5-11% of the tolerance), while
a planted unseeded noise source differed by 6e-4 at its first step, ~300 times
the tolerance there (results/repro/README.md has the figures). A run is
EQUIVALENT when every variable and loss at every step is within tolerance.
Keras's own train step is also calibrated with each batch's gradient split as two
ranks split it (Note [Calibrating as the ranks round] in repro/calibration_step.py):
then it is the ranks' own rounding rather than a proxy, and SPLIT_SPREAD = 4 (2
bits, for 4 ranks rounding quarters where the calibration rounds halves) replaces
16, which would put the tolerance at the cap for a bfloat16 Adam model whose
rounding moves weights by 4e-3 (and let a rank that drops its gradient pass), and
beyond float32's cap for the issue-44 ResNet pattern, which one reordering moves
once by 2.8e-5. SPREAD = 16 stays where the calibration is the reversal alone: a
model with its own train_step, and a script that wraps its model in tnt.Model itself.

If the calibration already differs by more than sqrt(u) after one step, or
its first step's loss (the same weights: the forward pass alone) by more than
sqrt of float32's u, the difference cannot be rounding (one step of
reassociation moves the last few bits): the model treats samples by their
position in the batch in a way the
calibration cannot undo (Keras's random layers it can: their draws are reversed
with the batch, Note [Measured tolerance]; a stateful random op or a layer
reading row indices it cannot). The tolerance then falls back to the floor and
the report says why.

Note [Tolerance cap]
The tolerance never exceeds the cap, sqrt(u) of the compute dtype (float32: CAP = 2**-12,
~2.4e-4; bfloat16: 2**-4; repro/precision.py), relative to the largest weight of a
variable, whatever the calibration measured and however many steps ran (in float32 the floor
s * u alone reaches it after 256 steps). At that size half of the compute dtype's significand
bits of the largest weight differ (in float32, 12 of 24): rounding in a stable training stays far below (the project's
examples: 3.8e-7 and 5.2e-7 after 30 steps), while real bugs are of that size (the planted
unseeded noise source: 6e-4 at its first step). A tolerance wider than the cap could not tell
the two apart. A calibration whose derived tolerance would exceed the cap (a training that
amplifies rounding, or, calibrated by reversal alone with its spread of 16, one that takes a single
jump: BatchNormalization over batch halves of other scales moved the issue-44 residual CNN by 2.8e-5 at
step 1 and no further) is not widened
into a loose check, and it is no verdict on the distributed run either: the calibration is the
serial run against itself. The comparisons then have three outcomes (Note [Undecided]).

Note [Undecided]
With a calibration beyond the cap, a distributed run's difference d at step s is
  within the cap                         EQUIVALENT: no tolerance could be wider, so it passes;
  beyond SPREAD x the calibration        DIVERGENT: more than reordering the batch alone moved
  (the uncapped tolerance)               the serial run, evidence against the distributed run;
  in between                             UNDECIDED: rounding could explain it and a defect too;
                                         the verdict says so and what decides it (--mode exact,
                                         bit for bit, or fewer --steps).
The checker fails only on evidence (repro/cli.py: exit 1 for DIVERGENT and the other failing
verdicts, 3 when the only open question is an UNDECIDED one, 0 when all pass).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from repro import precision
from repro.compare import Differences

__all__ = ["UNIT_ROUNDOFF", "SPREAD", "SPLIT_SPREAD", "CAP", "Tolerance", "derive"]

UNIT_ROUNDOFF = precision.unit_roundoff(precision.FLOAT32)  # 2**-24
SPREAD = 16.0
SPLIT_SPREAD = 4.0   # when the calibration split the gradients as the ranks do (Note [Calibrating as the ranks round])
CAP = precision.cap(precision.FLOAT32)                # 2**-12: float32's (Note [Tolerance cap])


@dataclasses.dataclass
class Tolerance:
    weights: np.ndarray          # [step] relative tolerance of every weight variable
    losses: np.ndarray           # [step] relative tolerance of the step's loss
    calibration_envelope: np.ndarray
    order_sensitive: bool
    how: str                     # one line for the report
    exceeded_cap_at: int | None = None   # first step where the derived tolerance would exceed the cap
    uncapped_weights: np.ndarray | None = None   # [step] the derived weight tolerance before capping
    uncapped_losses: np.ndarray | None = None    # [step] the same for the loss
    compute_dtype: str = precision.FLOAT32  # Note [Tolerance from the compute dtype]
    spread: float = SPREAD

    @property
    def cap(self) -> float:
        return precision.cap(self.compute_dtype)

    @property
    def uncapped_maximum(self) -> float:
        """The largest derived weight tolerance before capping."""
        return 0.0 if self.uncapped_weights is None else float(self.uncapped_weights.max(initial=0.0))

    @property
    def low_precision(self) -> bool:
        return precision.unit_roundoff(self.compute_dtype) > UNIT_ROUNDOFF

    def at(self, step: int) -> float:
        return float(self.weights[min(step, len(self.weights) - 1)])

    def loss_at(self, step: int) -> float:
        return float(self.losses[min(step, len(self.losses) - 1)])

    def undecided_up_to(self, step: int, loss: bool = False) -> float:
        """Beyond the tolerance and up to this, a difference is UNDECIDED (Note [Undecided]); no band when the
        calibration stayed within the cap."""
        band = self.uncapped_losses if loss else self.uncapped_weights
        if self.exceeded_cap_at is None or band is None:
            return self.loss_at(step) if loss else self.at(step)
        return float(band[min(step, len(band) - 1)])

    def as_dict(self) -> dict:
        return {"how": self.how, "spread": self.spread, "compute_dtype": self.compute_dtype,
                "unit_roundoff": precision.unit_roundoff(self.compute_dtype), "cap": self.cap,
                "exceeded_cap_at": self.exceeded_cap_at, "uncapped_maximum": self.uncapped_maximum,
                "order_sensitive": self.order_sensitive,
                "order_sensitive_limit": self.cap,  # both sqrt(u) (Note [Tolerance from the compute dtype])
                "calibration_envelope": self.calibration_envelope.tolist(),
                "weight_tolerance": self.weights.tolist(), "loss_tolerance": self.losses.tolist()}


def _running_max(values: np.ndarray) -> np.ndarray:
    return np.maximum.accumulate(np.nan_to_num(values, nan=0.0))


def derive(calibration: Differences, compute_dtype: str = precision.FLOAT32, split: bool = False) -> Tolerance:
    """The tolerance per step from the serial-vs-calibration differences, for a model computing in
    `compute_dtype` (Note [Tolerance from the compute dtype]); `split`: the calibration split the gradients."""
    spread = SPLIT_SPREAD if split else SPREAD
    u, cap = precision.unit_roundoff(compute_dtype), precision.cap(compute_dtype)
    dtype = precision.describe(compute_dtype)
    steps = np.arange(calibration.steps + 1, dtype=np.float64)
    # the float32 variables accumulate the updates; one rounding of the compute dtype in each run compared
    # (Note [Tolerance from the compute dtype])
    floor = np.maximum(steps * UNIT_ROUNDOFF, np.minimum(steps, 1) * precision.COMPUTE_FLOOR * u / spread)
    per_step = calibration.weights.max(axis=1) if calibration.weights.size else np.zeros(len(steps))
    weight_limit = cap  # sqrt(u): what one step of reassociation cannot reach
    first_loss = float(calibration.losses[1]) if calibration.steps >= 1 else 0.0
    moved_weights = calibration.steps >= 1 and float(per_step[1]) > weight_limit
    moved_loss = first_loss == first_loss and first_loss > precision.LOSS_ORDER_LIMIT
    order_sensitive = bool(moved_weights or moved_loss)
    if order_sensitive:
        envelope = np.zeros(len(steps))
        loss_envelope = np.zeros(len(steps))
        what = (f"changed the weights by {per_step[1]:.2e} (> sqrt(u) = {weight_limit:.1e} of {dtype})"
                if moved_weights else
                f"changed the first step's loss by {first_loss:.2e} (> {precision.LOSS_ORDER_LIMIT:.1e}: the same "
                f"weights, only the forward pass)")
        how = (f"calibration invalid: reversing the samples of a batch {what} after one step, so the model treats "
               f"samples by position (random values not drawn per sample, row indices); tolerance = {spread:g} * "
               f"step * u only")
    else:
        envelope = _running_max(per_step)
        loss_envelope = _running_max(calibration.losses)
        calibrated = "reversed-and-split-batch" if split else "reversed-batch"
        how = (f"tolerance[step] = {spread:g} * max(running max of the serial-vs-{calibrated} difference, "
               f"step * 2^-24, {precision.COMPUTE_FLOOR:g} u / {spread:g}), compute dtype {dtype}; measured "
               f"envelope after {calibration.steps} steps: {envelope[-1]:.2e} (weights), {loss_envelope[-1]:.2e} "
               f"(loss)")
    uncapped = spread * np.maximum(envelope, floor)
    exceeded = np.flatnonzero(spread * envelope > cap)
    exceeded_at = int(exceeded[0]) if exceeded.size else None
    if exceeded_at is not None:
        calibrated = "reversed-and-split-batch" if split else "reversed-batch"
        how = (f"calibration exceeds the cap: the serial-vs-{calibrated} difference reached "
               f"{envelope[exceeded_at]:.2e} at step {exceeded_at} ({spread:g} x that > cap {cap:.2e} of {dtype}; "
               f"at the end {envelope[-1]:.2e}); tolerance capped at {cap:.2e}, not widened: within it "
               f"EQUIVALENT, beyond {spread:g} x the calibration DIVERGENT, in between UNDECIDED "
               f"(Note [Undecided])")
    else:
        how += f"; capped at {cap:.2e} (Note [Tolerance cap])"
    uncapped_losses = spread * np.maximum(loss_envelope, floor)
    return Tolerance(np.minimum(uncapped, cap), np.minimum(uncapped_losses, cap), envelope, order_sensitive, how,
                     exceeded_at, uncapped, uncapped_losses, compute_dtype, spread)
