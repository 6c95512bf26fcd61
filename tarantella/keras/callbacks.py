"""Which Keras callbacks run on which rank.

Callbacks that write output (files, TensorBoard events, the progress bar) run
on the master rank only, or on every rank with --output-on-all-devices. All
others (EarlyStopping, LearningRateScheduler, ReduceLROnPlateau,
TerminateOnNaN, user callbacks) run on every rank: they see the same global
logs everywhere (tarantella/keras/metric_reduction.py), so every rank decides
the same way, e.g. stops in the same epoch.
"""
from __future__ import annotations

import keras

from tarantella import runtime

__all__ = ["OUTPUT_CALLBACKS", "output_on_this_rank", "callbacks_for_this_rank", "verbosity_for_this_rank"]

OUTPUT_CALLBACKS = (keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard, keras.callbacks.CSVLogger,
                    keras.callbacks.ProgbarLogger)


def output_on_this_rank() -> bool:
    return runtime.is_master_rank() or runtime.settings().output_on_all_devices


def callbacks_for_this_rank(callbacks):
    if callbacks is None or output_on_this_rank():
        return callbacks
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    return [callback for callback in callbacks if not isinstance(callback, OUTPUT_CALLBACKS)]


def verbosity_for_this_rank(verbose):
    return verbose if output_on_this_rank() else 0
