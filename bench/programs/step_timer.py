"""A Keras callback that records the wall time of every training step."""
from __future__ import annotations

import time

import keras

__all__ = ["StepTimer"]


class StepTimer(keras.callbacks.Callback):
    """Step i's time is the span between the ends of steps i-1 and i (the first step
    from its begin), so input fetching and callback overhead count, as in real training."""

    def __init__(self):
        super().__init__()
        self.step_times: list[float] = []
        self._last = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._last is None:
            self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now
