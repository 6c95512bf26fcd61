"""Reading what the recorder (tarantella/repro_hook.py) wrote for one run."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

import numpy as np

__all__ = ["Record", "load_record", "RecordMissing"]


class RecordMissing(RuntimeError):
    """A run ended without a record: the script never called `fit` (of tnt.Model or Keras)."""


@dataclasses.dataclass
class Record:
    name: str
    steps: list[dict]                    # the master rank's steps (step 0: initial weights)
    rank_steps: dict[int, list[dict]]    # every rank's steps (fingerprints only)
    values: dict[str, np.ndarray] | None  # "step|key" -> weights, when the recorder kept them

    @property
    def step_count(self) -> int:
        """Training steps recorded (not counting step 0)."""
        return len(self.steps) - 1

    def keys(self) -> list[str]:
        return [weight["key"] for weight in self.steps[0]["weights"]]

    def weight(self, step: int, key: str) -> dict:
        for weight in self.steps[step]["weights"]:
            if weight["key"] == key:
                return weight
        raise KeyError(key)

    def value(self, step: int, key: str) -> np.ndarray | None:
        if self.values is None:
            return None
        return self.values.get(f"{step}|{key}")

    def step_losses(self) -> list[float | None]:
        return [step["step_loss"] for step in self.steps[1:]]

    def step_seconds(self) -> list[float]:
        return [step["seconds"] for step in self.steps[1:] if step["seconds"] is not None]


def load_record(directory: str, name: str) -> Record:
    paths = glob.glob(os.path.join(directory, "rank*.json"))
    if not paths:
        raise RecordMissing(f"no record in {directory}: the script did not train (no call to fit reached)")
    rank_steps = {}
    for path in paths:
        match = re.search(r"rank(\d+)\.json$", path)
        if match is None:
            continue
        with open(path) as handle:
            rank_steps[int(match.group(1))] = json.load(handle)["steps"]
    if 0 not in rank_steps:
        raise RecordMissing(f"no record of the master rank in {directory}")
    values_path = os.path.join(directory, "rank0.npz")
    values = None
    if os.path.exists(values_path):
        with np.load(values_path) as archive:
            values = {key: archive[key] for key in archive.files}
    return Record(name, rank_steps[0], rank_steps, values)
