"""A Keras callback that records the wall time of every training step."""
from __future__ import annotations

import time

import keras

from bench.programs.result_line import PROGRESS_TAG

__all__ = ["StepTimer"]


class StepTimer(keras.callbacks.Callback):
    """Step i's time is the span between the ends of steps i-1 and i (the first step
    from its begin), so input fetching and callback overhead count, as in real training."""

    def __init__(self, progress_steps: int | None = None, warmup_steps: int = 0):
        """With `progress_steps` (the master rank's timer), one PROGRESS_TAG line per step on stdout, for
        the sweep to show while it measures (bench/launched_run.py streams them)."""
        super().__init__()
        self.step_times: list[float] = []
        self._last = None
        self._progress_steps, self._warmup_steps = progress_steps, warmup_steps

    def on_train_batch_begin(self, batch, logs=None):
        if self._last is None:
            self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now
        if self._progress_steps:
            # the optimizer's count: in an elastic job's later generation the timer's list is the commit's
            step = int(self.model.optimizer.iterations.numpy())
            kind = "warm-up" if step <= self._warmup_steps else "timed"
            print(f"{PROGRESS_TAG}step {step}/{self._progress_steps} ({kind}) {self.step_times[-1]:.2f} s",
                  flush=True)
