"""Step-by-step, variable-by-variable differences between two recorded runs.

The difference of a weight variable is scale-relative: max|a - b| / max|a|
(element-wise ratios blow up where a weight is near zero). Where the recorder
kept only fingerprints (large models), the relative difference of the L2
norms stands in for it (a lower bound). Loss differences are |a - b| / |a|.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from repro.records import Record

__all__ = ["Differences", "differences", "relative_weight_difference", "ranks_disagree"]

_TINY = 1e-30


@dataclasses.dataclass
class Differences:
    steps: int                              # steps present in both runs (after step 0)
    step_counts: tuple[int, int]            # steps of each run
    keys: list[str]
    bitwise: list[list[bool]]               # [step][key]: same bits
    weights: np.ndarray                     # [step, key] relative difference (step 0 = initial weights)
    losses: np.ndarray                      # [step] relative difference of the step's loss (index 0: nan)

    @property
    def identical(self) -> bool:
        return self.step_counts[0] == self.step_counts[1] and all(all(row) for row in self.bitwise)

    def first_bitwise_difference(self) -> tuple[int, str] | None:
        for step, row in enumerate(self.bitwise):
            for key, same in zip(self.keys, row):
                if not same:
                    return step, key
        return None


def relative_weight_difference(reference: Record, other: Record, step: int, key: str) -> float:
    a, b = reference.value(step, key), other.value(step, key)
    if a is not None and b is not None:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        return float(np.max(np.abs(a64 - b64), initial=0.0) / max(float(np.max(np.abs(a64), initial=0.0)), _TINY))
    norm_a, norm_b = reference.weight(step, key)["norm"], other.weight(step, key)["norm"]
    return abs(norm_a - norm_b) / max(abs(norm_a), _TINY)


def _relative(a, b) -> float:
    if a is None or b is None:
        return float("nan")
    return abs(a - b) / max(abs(a), _TINY)


def differences(reference: Record, other: Record) -> Differences:
    keys = reference.keys()
    if other.keys() != keys:
        raise ValueError(f"the runs trained different variables: {keys} vs {other.keys()}")
    steps = min(reference.step_count, other.step_count)
    bitwise = [[reference.weight(s, k)["sha256"] == other.weight(s, k)["sha256"] for k in keys]
               for s in range(steps + 1)]
    weights = np.array([[0.0 if same else relative_weight_difference(reference, other, s, k)
                         for k, same in zip(keys, bitwise[s])] for s in range(steps + 1)])
    losses = np.array([float("nan")] + [_relative(reference.steps[s]["step_loss"], other.steps[s]["step_loss"])
                                        for s in range(1, steps + 1)])
    return Differences(steps, (reference.step_count, other.step_count), keys, bitwise, weights, losses)


def ranks_disagree(record: Record) -> tuple[int, int, str] | None:
    """(step, rank, key) where a rank's weights first differ from the master rank's, if anywhere."""
    master = record.steps
    for rank, steps in sorted(record.rank_steps.items()):
        for step, (mine, theirs) in enumerate(zip(master, steps)):
            for a, b in zip(mine["weights"], theirs["weights"]):
                if a["sha256"] != b["sha256"]:
                    return step, rank, a["key"]
    return None
