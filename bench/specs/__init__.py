"""Benchmark specs, as data (one JSON file each): data set, quality target, reference
hyper-parameters, and how the learning rate warms up and scales with the global batch.

    base_learning_rate x scale(global_batch / base_global_batch)
    scale: "linear" (Goyal et al.), "sqrt", or "none"
    warm-up: linearly from 0 over warmup_epochs (or warmup_steps), then `decay`
"""
from __future__ import annotations

import json
import math
import os

from bench.errors import BenchUsageError

__all__ = ["SPECS_DIR", "spec_names", "load_spec", "scaled_learning_rate", "learning_rate_at"]

SPECS_DIR = os.path.dirname(os.path.abspath(__file__))


def spec_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(SPECS_DIR) if f.endswith(".json"))


def load_spec(name: str) -> dict:
    path = os.path.join(SPECS_DIR, f"{name}.json")
    if not os.path.exists(path):
        raise BenchUsageError(f"unknown benchmark {name!r}; known: {', '.join(spec_names())}")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def scaled_learning_rate(reference: dict, global_batch: int) -> float:
    ratio = global_batch / reference["base_global_batch"]
    rule = reference.get("learning_rate_scaling", "linear")
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]
    return reference["base_learning_rate"] * factor


def learning_rate_at(reference: dict, global_batch: int, step: int, steps_per_epoch: int,
                     total_steps: int) -> float:
    """The learning rate of `step` (0-based): warm-up, then the spec's decay."""
    peak = scaled_learning_rate(reference, global_batch)
    warmup = reference.get("warmup_steps") or int(reference.get("warmup_epochs", 0) * steps_per_epoch)
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    decay = reference.get("decay", "none")
    if decay == "polynomial":
        left = max(total_steps - warmup, 1)
        done = min(step - warmup, left) / left
        end = reference.get("end_learning_rate", 0.0)
        return end + (peak - end) * (1.0 - done) ** 2
    if decay == "inverse_sqrt":
        return peak * math.sqrt(max(warmup, 1) / max(step + 1, 1))
    return peak
