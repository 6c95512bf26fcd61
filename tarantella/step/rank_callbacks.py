"""Which Keras callbacks run on which rank.

Callbacks that write output (files, TensorBoard events, the progress bar) run
on the master rank only, or on every rank with --output-on-all-devices. All
others (EarlyStopping, LearningRateScheduler, ReduceLROnPlateau,
TerminateOnNaN, user callbacks) run on every rank: they see the same global
logs everywhere (tarantella/step/metric_reduction.py), so every rank decides
the same way, e.g. stops in the same epoch.

BackupAndRestore writes its backup from the master only (one writer per file);
on resume the master reads the backup and every rank takes the master's state
(weights, optimizer state, the epoch to start from), so all ranks go on from the
same state and the run ends bitwise equal to an uninterrupted one.

With shard="optimizer" saving is a collective (Note [Saving and restoring
sharded optimizer state] in tarantella/sharding/checkpoint.py): ModelCheckpoint
runs on every rank (each calls the model's save; the master writes), and on the
other ranks a BackupAndRestore twin, with the same settings and a private
directory, takes the same decisions to save as the master's, so that every
rank joins each save; on resume every rank gets its share of the restored
optimizer state from the master.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile

import keras
import numpy as np

from tarantella import collectives, runtime, stage_state
from tarantella.step.optimizers import optimizers_of

__all__ = ["OUTPUT_CALLBACKS", "output_on_this_rank", "callbacks_for_this_rank", "verbosity_for_this_rank",
           "state_variables"]

OUTPUT_CALLBACKS = (keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard, keras.callbacks.CSVLogger,
                    keras.callbacks.ProgbarLogger)


def output_on_this_rank() -> bool:
    return runtime.is_master_rank() or runtime.settings().output_on_all_devices


def callbacks_for_this_rank(callbacks, collective_saves: bool = False):
    """collective_saves: the model's save is a collective (shard="optimizer"), so the callbacks that save run
    on every rank."""
    if callbacks is None:
        return callbacks
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    callbacks = [BackupAndRestoreFromMaster(callback, collective_saves)
                 if isinstance(callback, keras.callbacks.BackupAndRestore) else callback for callback in callbacks]
    if output_on_this_rank():
        return callbacks
    kept = (keras.callbacks.ModelCheckpoint,) if collective_saves else ()
    return [callback for callback in callbacks
            if not isinstance(callback, OUTPUT_CALLBACKS) or isinstance(callback, kept)]


class BackupAndRestoreFromMaster(keras.callbacks.Callback):
    """A keras.callbacks.BackupAndRestore run by the master; the other ranks take its state on resume."""

    def __init__(self, backup: keras.callbacks.BackupAndRestore, collective_saves: bool = False):
        super().__init__()
        self.twin_directory = None
        if not runtime.is_master_rank() and collective_saves:
            # Same settings, its own directory: it decides to save when the master does, and joins each save.
            self.twin_directory = tempfile.mkdtemp(prefix="tnt-backup-twin-")
            backup = keras.callbacks.BackupAndRestore(self.twin_directory, save_freq=backup.save_freq,
                                                      double_checkpoint=backup.double_checkpoint,
                                                      delete_checkpoint=backup.delete_checkpoint)
        self.backup = backup
        self._saves_here = runtime.is_master_rank() or collective_saves

    def set_model(self, model):
        super().set_model(model)
        self.backup.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.backup.set_params(params)

    def on_train_begin(self, logs=None):
        master = runtime.is_master_rank()
        sharded = getattr(self.model, "is_sharded", False)
        optimizer = getattr(self.model, "optimizer", None)
        if runtime.get_size() > 1 and optimizer is not None and not optimizer.built:
            # Built on every rank before the master reads the backup (Keras's load builds it otherwise, on the
            # master alone: a sharded optimizer's build is a collective).
            optimizer.build(self.model.trainable_variables)
        if master:
            with self.model.master_restores_for_all() if sharded else contextlib.nullcontext():
                self.backup.on_train_begin(logs)
        if runtime.get_size() == 1:
            return
        # Keras's BackupAndRestore restores the epoch through this attribute of the model; so do we.
        epoch = collectives.broadcast_object(getattr(self.model, "_initial_epoch", None) if master else None)
        if epoch is None:
            return
        self.model._initial_epoch = epoch
        if sharded:
            self.model.share_restored_optimizer_state()
        for variable in state_variables(self.model, with_optimizers=not sharded):
            value = collectives.broadcast(np.array(variable.numpy(), copy=True), root=runtime.get_master_rank())
            if not master and not stage_state.is_released(variable):   # shard="weights": the owned ones
                variable.assign(value)
        if sharded:
            self.model.release_unowned_weights()

    def on_epoch_end(self, epoch, logs=None):
        if self._saves_here:
            self.backup.on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._saves_here:
            self.backup.on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        if self._saves_here:
            self.backup.on_train_end(logs)
        if self.twin_directory:
            shutil.rmtree(self.twin_directory, ignore_errors=True)


def state_variables(model, with_optimizers: bool = True) -> list:
    """Everything a backup restores: the model's variables and (with_optimizers) its optimizers' (each once)."""
    wrapped = getattr(model, "wrapped_model", model)
    optimizers = optimizers_of(wrapped) + optimizers_of(model) if with_optimizers else []
    variables, seen = [], set()
    for variable in list(wrapped.variables) + [v for o in optimizers for v in o.variables]:
        if id(variable) not in seen:
            seen.add(id(variable))
            variables.append(variable)
    return variables


def verbosity_for_this_rank(verbose):
    return verbose if output_on_this_rank() else 0
