"""Every weight element of a run, fingerprinted and compared with a reference run on the rank.

Note [Every element compared]
The recorder describes each weight variable at every step by
  chunks    SHA-256 (first 16 hex digits) of each run of CHUNK_ELEMENTS elements in memory
            order; two runs hold the same bits exactly when every chunk hash agrees
            (IDENTICAL, run-to-run and cross-rank checks use these)
  max_abs   max |w - w_ref| over all elements, against the reference run at the same step
  max_rel   max_abs / max |w_ref|: scale-relative, because element-wise ratios blow up where
            a weight is near zero (what the tolerance of repro/tolerance.py bounds)
The reference run (the serial run of `tnt-repro check`) stores its master rank's weights at
every step (weights/step<s>.npz in its record directory); each later run's master rank loads
them step by step and computes the differences chunk by chunk, in float64, so the memory above
the model's own is one step of the reference plus one chunk. No comparison rests on a summary
such as a norm: a perturbation orthogonal to the weights moves the norm by a second-order
amount, but moves every element it touches by its own size.
Cost: the reference's disk is model size x recorded steps (cap the steps with --steps for
large models); hashing and differencing cost one pass over the weights per step.

Note [Reading a reference while it runs]
A run may start while its reference still trains (Note [Runs side by side] in repro/schedule.py):
at step s its master rank waits until the reference has stored step s, polling the file, which
the reference writes under a temporary name and renames, so a step is there whole or not at all.
It stops waiting when the harness has marked the reference's directory ENDED_FILE (its processes
have ended): a step not stored by then never will be (the reference trained fewer steps, or
failed, and then the check stops this run too). The wait is not part of the step's recorded time.
"""
from __future__ import annotations

import hashlib
import math
import os
import time

import numpy as np

from tarantella._repro.protocol import ENDED_FILE

__all__ = ["CHUNK_ELEMENTS", "chunk_hashes", "difference", "store_step", "ReferenceWeights"]

CHUNK_ELEMENTS = 1 << 18   # 1 MiB of float32 per hash and per float64 difference pass
_TINY = 1e-30


def _chunks(flat: np.ndarray):
    for start in range(0, max(flat.size, 1), CHUNK_ELEMENTS):
        yield start, flat[start:start + CHUNK_ELEMENTS]


def chunk_hashes(value: np.ndarray) -> list[str]:
    flat = np.ascontiguousarray(value).reshape(-1)
    return [hashlib.sha256(chunk.tobytes()).hexdigest()[:16] for _, chunk in _chunks(flat)]


def difference(value: np.ndarray, reference: np.ndarray) -> dict:
    """{max_abs, max_rel, scale} of `value` against `reference` over every element, chunk by chunk.
    A shape mismatch or a non-finite difference (NaN, inf) counts as infinitely far."""
    if value.shape != reference.shape:
        return {"max_abs": math.inf, "max_rel": math.inf, "scale": None}
    flat, ref = np.ascontiguousarray(value).reshape(-1), np.ascontiguousarray(reference).reshape(-1)
    max_abs = scale = 0.0
    for start, chunk in _chunks(flat):
        ref_chunk = ref[start:start + chunk.size].astype(np.float64)
        gap = np.abs(chunk.astype(np.float64) - ref_chunk)
        if gap.size:
            worst = float(np.max(gap))
            if not math.isfinite(worst) and not np.array_equal(chunk, ref[start:start + chunk.size], equal_nan=True):
                return {"max_abs": math.inf, "max_rel": math.inf, "scale": None}
            max_abs = max(max_abs, worst if math.isfinite(worst) else 0.0)
            scale = max(scale, float(np.max(np.abs(ref_chunk))))
    return {"max_abs": max_abs, "max_rel": max_abs / max(scale, _TINY) if max_abs else 0.0, "scale": scale}


def _step_path(directory: str, step: int) -> str:
    return os.path.join(directory, "weights", f"step{step}.npz")


def store_step(directory: str, step: int, values: dict[str, np.ndarray]) -> None:
    """The reference run's weights at `step` (keyed by the recorder's variable keys)."""
    os.makedirs(os.path.join(directory, "weights"), exist_ok=True)
    path = _step_path(directory, step)
    with open(path + ".tmp", "wb") as handle:
        np.savez(handle, **{key.replace("/", "|"): value for key, value in values.items()})
    os.replace(path + ".tmp", path)


class ReferenceWeights:
    """The stored weights of a reference run, read one step at a time, also while it runs (Note [Reading a
    reference while it runs])."""

    POLL_SECONDS = 0.02

    def __init__(self, directory: str):
        self.directory = directory

    def at(self, step: int) -> dict[str, np.ndarray] | None:
        path = _step_path(self.directory, step)
        while not os.path.exists(path):
            if os.path.exists(os.path.join(self.directory, ENDED_FILE)):
                if os.path.exists(path):     # stored between the two looks
                    break
                if not os.path.isdir(os.path.join(self.directory, "weights")):
                    raise FileNotFoundError(f"tnt-repro: no reference weights in {self.directory} (the reference "
                                            f"run stored none)")
                return None   # the reference trained fewer steps
            time.sleep(self.POLL_SECONDS)
        with np.load(path) as archive:
            return {key.replace("|", "/"): archive[key] for key in archive.files}
