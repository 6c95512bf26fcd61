"""Reading what the recorder (tarantella/_repro/hook.py) wrote for one run."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

from repro import precision

__all__ = ["Record", "load_record", "RecordMissing"]


class RecordMissing(RuntimeError):
    """A run ended without a record: the script never called `fit` (of tnt.Model or Keras)."""


@dataclasses.dataclass
class Record:
    name: str
    directory: str
    steps: list[dict]                    # the master rank's steps (step 0: initial weights)
    rank_steps: dict[int, list[dict]]    # every rank's steps (chunk hashes)
    world_size: int                      # ranks of the job (from the launcher's variables)
    strategy: str                        # what trained: tnt.Model, pipelining, or plain Keras
    gradient_reductions: int | None      # reductions the engine performed (None: not counted)
    reduction_count_source: str | None
    reference: str | None                # directory of the record the master rank compared itself with
    batch_norm: str | None = None        # tnt.Model's batch_norm ("global", "local"; None: not a tnt.Model)
    unmatched_random_ops: tuple = ()     # random ops whose values could not be serial's ("name (type)")
    batch_norm_layers: int = 0           # BatchNormalization layers in the trained model
    compute_dtypes: tuple = ()           # the compute dtypes of the layers with weights
    notes: dict = dataclasses.field(default_factory=dict)  # the harness's notes (tarantella._repro.hook.note)

    @property
    def compute_dtype(self) -> str:
        """The least precise of them (Note [Tolerance from the compute dtype] in repro/precision.py)."""
        return precision.lowest(self.compute_dtypes)

    @property
    def step_count(self) -> int:
        """Training steps recorded (not counting step 0)."""
        return len(self.steps) - 1

    def keys(self) -> list[str]:
        return [weight["key"] for weight in self.steps[0]["weights"]]

    def elements(self) -> int:
        return sum(weight["elements"] for weight in self.steps[0]["weights"])

    def weight(self, step: int, key: str) -> dict:
        for weight in self.steps[step]["weights"]:
            if weight["key"] == key:
                return weight
        raise KeyError(key)

    def compared_with(self, other: "Record") -> bool:
        """Did this run's master rank compute its differences against `other`'s weights?"""
        return self.reference is not None and os.path.realpath(self.reference) == os.path.realpath(other.directory)

    def step_losses(self) -> list[float | None]:
        return [step["step_loss"] for step in self.steps[1:]]

    def step_seconds(self) -> list[float]:
        return [step["seconds"] for step in self.steps[1:] if step["seconds"] is not None]


def load_record(directory: str, name: str) -> Record:
    paths = glob.glob(os.path.join(directory, "rank*.json"))
    if not paths:
        raise RecordMissing(f"no record in {directory}: the script did not train (no call to fit reached)")
    documents = {}
    for path in paths:
        match = re.search(r"rank(\d+)\.json$", path)
        if match is None:
            continue
        with open(path) as handle:
            documents[int(match.group(1))] = json.load(handle)
    if 0 not in documents:
        raise RecordMissing(f"no record of the master rank in {directory}")
    master = documents[0]
    return Record(name, directory, master["steps"], {rank: doc["steps"] for rank, doc in documents.items()},
                  master["world_size"], master["strategy"], master["gradient_reductions"],
                  master["reduction_count_source"], master["reference"], master.get("batch_norm"),
                  tuple(master.get("unmatched_random_ops") or ()), int(master.get("batch_norm_layers") or 0),
                  tuple(master.get("compute_dtypes") or ()), dict(master.get("notes") or {}))
