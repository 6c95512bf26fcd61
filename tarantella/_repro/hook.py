"""Recording of a training run for `tnt-repro check`, without user code.

`tnt.Model.fit` adds `extra_callbacks()` to the user's callbacks. When the
harness has set TNT_REPRO_RECORD=<directory>, that is one `Recorder`; otherwise
nothing, and training is untouched.

What a Recorder writes into <directory> (Note [Record layout]):
  rank<r>.json      the run's scope (world size, strategy, gradient reductions the engine
                    performed, Note [Refusing runs that distributed nothing] in reductions.py)
                    and per step: the loss Keras logs, and per weight variable its chunk
                    hashes, and on the master rank its differences to the reference run
                    (Note [Every element compared] in weights.py); step 0 is the initial
                    weights. Every rank writes one, so the harness can check that all ranks
                    hold the same bits.
  weights/          (TNT_REPRO_STORE_WEIGHTS=1, the reference run) the master rank's weights per step
  progress          the master rank's last finished step, for the progress display.
TNT_REPRO_REFERENCE=<directory of the reference record>: the master rank compares its weights
with the reference's at every step. TNT_REPRO_MAX_STEPS=K stops training after K steps,
TNT_REPRO_MAX_EPOCHS=E after E epochs (it cannot add epochs to what the script asks for).
Only the first `fit` of a process is recorded.

Note [Record layout]
The loss in the logs is Keras's running mean over the epoch; the step's own
loss is recovered as k*m_k - (k-1)*m_(k-1). The weight variables are keyed by
their Keras path plus position, which is the same in every run of one script.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from tarantella._repro import reductions, weights as weight_records
from tarantella._repro.protocol import (MAX_EPOCHS_VARIABLE, MAX_STEPS_VARIABLE, RECORD_VARIABLE, REFERENCE_VARIABLE,
                                        STORE_WEIGHTS_VARIABLE)
from tarantella.step import serial_random

__all__ = ["note", "compute_dtypes", "RECORD_VARIABLE", "REFERENCE_VARIABLE", "STORE_WEIGHTS_VARIABLE",
           "MAX_STEPS_VARIABLE", "MAX_EPOCHS_VARIABLE", "extra_callbacks", "make_recorder", "rank_from_environment",
           "world_size_from_environment"]

_recorders_made = 0
_notes: dict = {}   # what the harness says of this run's steps (note()); written with the record


def note(key: str, value) -> None:
    """The harness notes something about how this process trains (repro/runner.py: the calibration split the
    gradients); it is written into the record as `notes`."""
    _notes[key] = value


def rank_from_environment() -> int:
    """This process's rank from the MPI launcher's variables (without starting the engine)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def world_size_from_environment() -> int:
    """The job's rank count from the MPI launcher's variables (1 outside a launcher)."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        if name in os.environ:
            return int(os.environ[name])
    return 1


def extra_callbacks() -> list:
    """The callbacks the harness wants in every `fit` ([] outside `tnt-repro check`)."""
    directory = os.environ.get(RECORD_VARIABLE)
    global _recorders_made
    if not directory or _recorders_made:
        return []
    _recorders_made += 1
    return [make_recorder(directory)]


def make_recorder(directory: str, reference: str | None = None, store_weights: bool | None = None):
    """A Recorder writing to `directory`; reference and store_weights default to the environment's."""
    import keras

    reference = os.environ.get(REFERENCE_VARIABLE) or None if reference is None else reference
    store_weights = os.environ.get(STORE_WEIGHTS_VARIABLE) == "1" if store_weights is None else store_weights

    class Recorder(keras.callbacks.Callback):
        """Writes the record of one `fit` (Note [Record layout]); one per process and fit."""

        is_tnt_repro_recorder = True

        def __init__(self):
            super().__init__()
            self.rank = rank_from_environment()
            self.master = self.rank == 0
            self.max_steps = _positive_int_env(MAX_STEPS_VARIABLE)
            self.max_epochs = _positive_int_env(MAX_EPOCHS_VARIABLE)
            self.reference = weight_records.ReferenceWeights(reference) if reference and self.master else None
            self.store = store_weights and self.master
            self.steps: list[dict] = []
            self.counter = None
            self.epoch = 0
            self.step_in_epoch = 0
            self.previous_mean = 0.0
            self.step_started = 0.0

        def on_train_begin(self, logs=None):
            os.makedirs(directory, exist_ok=True)
            self.counter = reductions.ReductionCounter(self.model)
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
            reference = self.reference.at(step) if self.reference is not None else None
            values, described = {}, []
            for index, (variable, value) in enumerate(_whole_model_weights(self.model)):
                key = f"{index:03d}:{variable.path}"
                entry = {"key": key, "trainable": bool(variable.trainable), "elements": int(value.size),
                         "chunks": weight_records.chunk_hashes(value)}
                if reference is not None:
                    entry.update(weight_records.difference(value, reference[key]) if key in reference
                                 else {"max_abs": float("inf"), "max_rel": float("inf"), "scale": None})
                described.append(entry)
                if self.store:
                    values[key] = value
            if self.store:
                weight_records.store_step(directory, step, values)
            self.steps.append({"step": step, "epoch": self.epoch, "loss": loss, "step_loss": step_loss,
                               "seconds": seconds, "reductions": self.counter.update(),
                               "compared_with_reference": reference is not None, "weights": described})
            if self.master:
                with open(os.path.join(directory, "progress"), "w") as handle:
                    handle.write(str(step))
            if step % 50 == 0:
                self._write()

        def _write(self):
            path = os.path.join(directory, f"rank{self.rank}.json")
            document = {"rank": self.rank, "world_size": world_size_from_environment(),
                        "strategy": reductions.strategy_of(self.model),
                        "batch_norm": getattr(self.model, "batch_norm", None),
                        "batch_norm_layers": _batch_norm_layers(self.model),
                        "compute_dtypes": compute_dtypes(self.model),
                        "notes": dict(_notes),
                        "unmatched_random_ops": serial_random.unmatched(),
                        "gradient_reductions": self.steps[-1]["reductions"] if self.steps else None,
                        "reduction_count_source": self.counter.source if self.counter else None,
                        "chunk_elements": weight_records.CHUNK_ELEMENTS, "reference": reference,
                        "steps": self.steps}
            with open(path + ".tmp", "w") as handle:
                json.dump(document, handle)
            os.replace(path + ".tmp", path)

    return Recorder()


def compute_dtypes(model) -> list[str]:
    """The compute dtypes of the layers with weights (their dtype policies'); the checker takes the tolerance
    from the least precise (Note [Tolerance from the compute dtype] in repro/precision.py)."""
    model = getattr(model, "whole_model", model)
    return sorted({str(getattr(layer, "compute_dtype", None) or "float32") for layer in model._flatten_layers()
                   if layer.weights})


def _whole_model_weights(model) -> list:
    """(variable, value) of every weight of the model being trained. A pipelined model holds only its
    stage's: every rank gets the whole model's from their stages (a collective: the recorder runs on every
    rank at the same points), under the unpartitioned model's variables, the serial run's keys."""
    if hasattr(model, "sync_weights") and hasattr(model, "whole_model"):
        return list(zip(model.whole_model.weights, model.sync_weights()))
    return [(variable, np.asarray(variable.numpy())) for variable in model.weights]


def _batch_norm_layers(model) -> int:
    """BatchNormalization layers in `model` (nested models and tnt.Model's wrapped model included; a pipelined
    model's whole model, not only this rank's stage)."""
    import keras
    model = getattr(model, "whole_model", model)
    return sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model._flatten_layers())


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
