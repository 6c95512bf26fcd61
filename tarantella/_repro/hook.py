"""Recording of a training run for `tnt-repro check`, without user code.

`tnt.Model.fit` adds `extra_callbacks()` to the user's callbacks. When the
harness has set TNT_REPRO_RECORD=<directory>, that is one `Recorder`; otherwise
nothing, and training is untouched.

What a Recorder writes into <directory> (Note [Record layout]):
  rank<r>.json      per step: the loss Keras logs, and per weight variable its
                    SHA-256 (bitwise fingerprint), L2 norm and sum; step 0 is
                    the initial weights. Every rank writes one, so the harness
                    can check that all ranks hold the same weights.
  rank0.npz         (master rank, models up to FULL_VALUES_LIMIT values) the
                    weights themselves per step, for element-wise comparisons.
  progress          the master rank's last finished step, for the progress display.
TNT_REPRO_MAX_STEPS=K stops training after K steps, TNT_REPRO_MAX_EPOCHS=E
after E epochs (it cannot add epochs to what the script asks for). Only the
first `fit` of a process is recorded.

Note [Record layout]
The loss in the logs is Keras's running mean over the epoch; the step's own
loss is recovered as k*m_k - (k-1)*m_(k-1). The weight variables are keyed by
their Keras path plus position, which is the same in every run of one script.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

__all__ = ["RECORD_VARIABLE", "MAX_STEPS_VARIABLE", "MAX_EPOCHS_VARIABLE", "FULL_VALUES_LIMIT",
           "extra_callbacks", "make_recorder", "rank_from_environment"]

RECORD_VARIABLE = "TNT_REPRO_RECORD"
MAX_STEPS_VARIABLE = "TNT_REPRO_MAX_STEPS"
MAX_EPOCHS_VARIABLE = "TNT_REPRO_MAX_EPOCHS"
FULL_VALUES_LIMIT = 250_000  # weight values per step stored in full (tiny check models are far below)

_recorders_made = 0


def rank_from_environment() -> int:
    """This process's rank from the MPI launcher's variables (without starting the engine)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def extra_callbacks() -> list:
    """The callbacks the harness wants in every `fit` ([] outside `tnt-repro check`)."""
    directory = os.environ.get(RECORD_VARIABLE)
    global _recorders_made
    if not directory or _recorders_made:
        return []
    _recorders_made += 1
    return [make_recorder(directory)]


def make_recorder(directory: str):
    import keras

    class Recorder(keras.callbacks.Callback):
        """Writes the record of one `fit` (Note [Record layout]); one per process and fit."""

        is_tnt_repro_recorder = True

        def __init__(self):
            super().__init__()
            self.rank = rank_from_environment()
            self.max_steps = _positive_int_env(MAX_STEPS_VARIABLE)
            self.max_epochs = _positive_int_env(MAX_EPOCHS_VARIABLE)
            self.steps: list[dict] = []
            self.full_values: dict[str, np.ndarray] = {}
            self.keep_full = self.rank == 0
            self.epoch = 0
            self.step_in_epoch = 0
            self.previous_mean = 0.0
            self.step_started = 0.0

        def on_train_begin(self, logs=None):
            os.makedirs(directory, exist_ok=True)
            self.keep_full = self.rank == 0 and sum(int(np.prod(w.shape)) for w in self.model.weights) \
                <= FULL_VALUES_LIMIT
            self._record(step=0, loss=None, step_loss=None, seconds=None)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.step_in_epoch, self.previous_mean = epoch, 0, 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self.step_started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds = time.perf_counter() - self.step_started
            self.step_in_epoch += 1
            mean = _as_float((logs or {}).get("loss"))
            step_loss = None
            if mean is not None:
                k = self.step_in_epoch
                step_loss = k * mean - (k - 1) * self.previous_mean
                self.previous_mean = mean
            self._record(step=len(self.steps), loss=mean, step_loss=step_loss, seconds=seconds)
            if self.max_steps is not None and len(self.steps) - 1 >= self.max_steps:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            if self.max_epochs is not None and epoch + 1 >= self.max_epochs:
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            self._write()

        def _record(self, step, loss, step_loss, seconds):
            weights = []
            for index, variable in enumerate(self.model.weights):
                value = np.asarray(variable.numpy())
                key = f"{index:03d}:{variable.path}"
                weights.append({"key": key, "trainable": bool(variable.trainable),
                                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:32],
                                "norm": float(np.linalg.norm(value.astype(np.float64))),
                                "sum": float(value.astype(np.float64).sum())})
                if self.keep_full:
                    self.full_values[f"{step}|{key}"] = value
            self.steps.append({"step": step, "epoch": self.epoch, "loss": loss, "step_loss": step_loss,
                               "seconds": seconds, "weights": weights})
            if self.rank == 0:
                with open(os.path.join(directory, "progress"), "w") as handle:
                    handle.write(str(step))
            if step % 50 == 0:
                self._write()

        def _write(self):
            path = os.path.join(directory, f"rank{self.rank}.json")
            with open(path + ".tmp", "w") as handle:
                json.dump({"rank": self.rank, "steps": self.steps}, handle)
            os.replace(path + ".tmp", path)
            if self.keep_full and self.full_values:
                np.savez(os.path.join(directory, "rank0.npz"), **self.full_values)

    return Recorder()


def _positive_int_env(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    value = int(raw)
    if value < 1:
        raise ValueError(f"tarantella: {name}={raw!r} must be at least 1")
    return value


def _as_float(value) -> float | None:
    if value is None:
        return None
    return float(np.asarray(value))
