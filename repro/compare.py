"""Step-by-step, variable-by-variable differences between two recorded runs.

Every element counts (Note [Every element compared] in tarantella/_repro/weights.py): two
variables are bitwise equal when all their chunk hashes agree; the size of a difference is
the max |a - b| and max |a - b| / max |a| the later run's master rank computed against the
reference run's stored weights. For two runs neither of which was compared with the other
(run-to-run, as written), only the bits are compared, and a difference has no size (nan).
Loss differences are |a - b| / |a|.

Note [Variables at the rounding level]
Some variables hold nothing but rounding: a convolution's bias before BatchNormalization, an
attention key's bias. Their gradient is zero in exact arithmetic (the normalisation or the softmax
removes any shift), so they move only by the rounding residue of that zero, ~1e-9 where the model's
weights are ~1, and any reassociation of the batch sum (the calibration as much as the ranks)
changes them by their own size: relative to their own largest value they differ by ~1, which says
nothing. So a variable whose largest value is below sqrt(u) (float32: 2**-12, the cap) of the model's
largest weight at that step is measured against the model's largest weight instead (an absolute
difference of 3e-9 there is 3e-9): added to activations of the model's scale, a weight that small keeps
no more than 12 of its 24 bits anyway. ResNet-50 (a bias before each of its 53 BatchNormalization
layers) needs this; under bfloat16 (u = 2**-8, level 2**-4) a few steps' biases are such variables
(Note [Tolerance from the compute dtype] in repro/precision.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from repro import precision
from repro.records import Record

__all__ = ["Differences", "differences", "ranks_disagree", "scope"]

_TINY = 1e-30


@dataclasses.dataclass
class Differences:
    steps: int                              # steps present in both runs (after step 0)
    step_counts: tuple[int, int]            # steps of each run
    keys: list[str]
    bitwise: list[list[bool]]               # [step][key]: same bits in every chunk
    weights: np.ndarray                     # [step, key] relative difference (step 0 = initial weights)
    absolute: np.ndarray                    # [step, key] max absolute difference
    losses: np.ndarray                      # [step] relative difference of the step's loss (index 0: nan)
    sized: bool                             # the differences have sizes (one run was compared with the other)

    @property
    def identical(self) -> bool:
        return self.step_counts[0] == self.step_counts[1] and all(all(row) for row in self.bitwise)

    def first_bitwise_difference(self) -> tuple[int, str] | None:
        for step, row in enumerate(self.bitwise):
            for key, same in zip(self.keys, row):
                if not same:
                    return step, key
        return None


def _relative(a, b) -> float:
    if a is None or b is None:
        return float("nan")
    return abs(a - b) / max(abs(a), _TINY)


def differences(reference: Record, other: Record) -> Differences:
    keys = reference.keys()
    if other.keys() != keys:
        raise ValueError(f"the runs trained different variables: {keys} vs {other.keys()}")
    steps = min(reference.step_count, other.step_count)
    sized = other.compared_with(reference)
    bitwise = [[reference.weight(s, k)["chunks"] == other.weight(s, k)["chunks"] for k in keys]
               for s in range(steps + 1)]

    def size(step, key, same, field):
        if same:
            return 0.0
        return float(other.weight(step, key).get(field, float("nan"))) if sized else float("nan")

    absolute = np.array([[size(s, k, same, "max_abs") for k, same in zip(keys, bitwise[s])]
                         for s in range(steps + 1)])
    relative = np.array([[size(s, k, same, "max_rel") for k, same in zip(keys, bitwise[s])]
                         for s in range(steps + 1)])
    if sized:
        level = precision.rounding_level(precision.lowest([reference.compute_dtype, other.compute_dtype]))
        relative = _rounding_level_against_the_model(other, keys, relative, absolute, level)
    losses = np.array([float("nan")] + [_relative(reference.steps[s]["step_loss"], other.steps[s]["step_loss"])
                                        for s in range(1, steps + 1)])
    return Differences(steps, (reference.step_count, other.step_count), keys, bitwise, relative, absolute, losses,
                       sized)


def _rounding_level_against_the_model(other: Record, keys, relative, absolute, level: float):
    """Note [Variables at the rounding level]: rows of `relative` with a tiny variable's entry re-measured."""
    relative = relative.copy()
    for step in range(relative.shape[0]):
        scales = np.array([float(other.weight(step, key).get("scale") or 0.0) for key in keys])
        largest = float(scales.max(initial=0.0))
        tiny = (scales < level * largest) & np.isfinite(absolute[step])
        relative[step, tiny] = absolute[step, tiny] / max(largest, _TINY)
    return relative


def ranks_disagree(record: Record) -> tuple[int, int, str] | None:
    """(step, rank, key) where a rank's weights first differ from the master rank's, if anywhere."""
    master = record.steps
    for rank, steps in sorted(record.rank_steps.items()):
        for step, (mine, theirs) in enumerate(zip(master, steps)):
            for a, b in zip(mine["weights"], theirs["weights"]):
                if a["chunks"] != b["chunks"]:
                    return step, rank, a["key"]
    return None


def scope(reference: Record, other: Record, diffs: Differences) -> dict:
    """What a verdict compared, so that a reader sees its reach."""
    return {"tensors": len(diffs.keys), "elements_per_step": reference.elements(),
            "steps": diffs.steps + 1, "steps_note": "step 0 (initial weights) and every training step",
            "ranks": sorted(other.rank_steps), "reference_ranks": sorted(reference.rank_steps),
            "how": ("every element: max absolute and relative difference computed on the master rank against "
                    "the reference's stored weights, and SHA-256 of every chunk on every rank"
                    if diffs.sized else "every element's bits: SHA-256 of every chunk on every rank")}
