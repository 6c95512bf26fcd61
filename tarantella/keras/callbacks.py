"""Which Keras callbacks run on which rank.

Callbacks that write output (files, TensorBoard events, the progress bar) run
on the master rank only, or on every rank with --output-on-all-devices. All
others (EarlyStopping, LearningRateScheduler, ReduceLROnPlateau,
TerminateOnNaN, user callbacks) run on every rank: they see the same global
logs everywhere (tarantella/keras/metric_reduction.py), so every rank decides
the same way, e.g. stops in the same epoch.

BackupAndRestore writes its backup from the master only (one writer per file);
on resume the master reads the backup and every rank takes the master's state
(weights, optimizer state, the epoch to start from), so all ranks go on from the
same state and the run ends bitwise equal to an uninterrupted one.
"""
from __future__ import annotations

import keras
import numpy as np

from tarantella import collectives, runtime

__all__ = ["OUTPUT_CALLBACKS", "output_on_this_rank", "callbacks_for_this_rank", "verbosity_for_this_rank"]

OUTPUT_CALLBACKS = (keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard, keras.callbacks.CSVLogger,
                    keras.callbacks.ProgbarLogger)


def output_on_this_rank() -> bool:
    return runtime.is_master_rank() or runtime.settings().output_on_all_devices


def callbacks_for_this_rank(callbacks):
    if callbacks is None:
        return callbacks
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    callbacks = [BackupAndRestoreFromMaster(callback) if isinstance(callback, keras.callbacks.BackupAndRestore)
                 else callback for callback in callbacks]
    if output_on_this_rank():
        return callbacks
    return [callback for callback in callbacks if not isinstance(callback, OUTPUT_CALLBACKS)]


class BackupAndRestoreFromMaster(keras.callbacks.Callback):
    """A keras.callbacks.BackupAndRestore run by the master; the other ranks take its state on resume."""

    def __init__(self, backup: keras.callbacks.BackupAndRestore):
        super().__init__()
        self.backup = backup

    def set_model(self, model):
        super().set_model(model)
        self.backup.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.backup.set_params(params)

    def on_train_begin(self, logs=None):
        master = runtime.is_master_rank()
        if master:
            self.backup.on_train_begin(logs)
        if runtime.get_size() == 1:
            return
        # Keras's BackupAndRestore restores the epoch through this attribute of the model; so do we.
        epoch = collectives.broadcast_object(getattr(self.model, "_initial_epoch", None) if master else None)
        if epoch is None:
            return
        self.model._initial_epoch = epoch
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:  # the master's restore built it
            optimizer.build(self.model.trainable_variables)
        for variable in _state_variables(self.model):
            value = collectives.broadcast(np.array(variable.numpy(), copy=True), root=runtime.get_master_rank())
            if not master:
                variable.assign(value)

    def on_epoch_end(self, epoch, logs=None):
        if runtime.is_master_rank():
            self.backup.on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if runtime.is_master_rank():
            self.backup.on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        if runtime.is_master_rank():
            self.backup.on_train_end(logs)


def _state_variables(model) -> list:
    """Everything a backup restores: the model's variables and its optimizers' (each once)."""
    from tarantella.keras.distributed_optimizer import optimizers_of
    wrapped = getattr(model, "wrapped_model", model)
    variables, seen = [], set()
    for variable in list(wrapped.variables) + [v for o in optimizers_of(wrapped) + optimizers_of(model)
                                                for v in o.variables]:
        if id(variable) not in seen:
            seen.add(id(variable))
            variables.append(variable)
    return variables


def verbosity_for_this_rank(verbose):
    return verbose if output_on_this_rank() else 0
