"""A rank lost in the middle of a benchmark run under `tarantella --elastic` (tnt-bench scaling --kill-rank-at).

In the first generation the last rank writes the time and step to a file and kills itself (SIGKILL, as the OOM
killer or a lost node would end it) after step K; the launcher drops it and the next generation restores the
last commit (Note [Elastic generations] in tarantella/launcher/elastic.py). Its master notes where it resumed
and when its first step ended: the recovery time is that end minus the kill, and covers what a user waits for
(the loss found, the new ranks started, TensorFlow imported, the model built, the commit read, the first step
traced and trained).
"""
from __future__ import annotations

import json
import os
import signal
import time

import keras

import tarantella as tnt
from tarantella.elastic import GENERATION_VARIABLE

__all__ = ["RankFault", "resumed"]


# This process's own: an elastic job commits a callback's attributes (Note [Committed callback state] in
# tarantella/elastic/callback_state.py), and a later generation would restore the first one's.
_THIS_PROCESS: dict = {"resumed_from_step": None, "step_ends": []}


def _generation() -> int:
    return int(os.environ.get(GENERATION_VARIABLE) or 1)


class RankFault(keras.callbacks.Callback):
    def __init__(self, step: int, record_path: str):
        super().__init__()
        self.step, self.record_path = step, record_path

    def on_train_batch_begin(self, batch, logs=None):
        if _generation() > 1 and _THIS_PROCESS["resumed_from_step"] is None:   # the commit is restored by now
            _THIS_PROCESS["resumed_from_step"] = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        done = int(self.model.optimizer.iterations.numpy())
        if _generation() == 1:
            if done == self.step and tnt.get_rank() == tnt.get_size() - 1:
                with open(self.record_path, "w", encoding="utf-8") as handle:
                    json.dump({"time": time.time(), "step": done, "rank": tnt.get_rank(), "ranks": tnt.get_size()},
                              handle)
                os.kill(os.getpid(), signal.SIGKILL)
            return
        # Batches of the resumed epoch that the commit holds already are read and dropped, not trained: the
        # optimizer's count does not move for them.
        ends = _THIS_PROCESS["step_ends"]
        if done > _THIS_PROCESS["resumed_from_step"] + len(ends):
            ends.append(time.time())


def resumed() -> dict | None:
    """After the fit of a later generation: where it resumed, when its first step ended, and the times of its
    other steps (the first one traced the step and read the commit); None in the first generation."""
    ends = _THIS_PROCESS["step_ends"]
    if not ends:
        return None
    return {"generation": _generation(), "ranks": tnt.get_size(),
            "resumed_from_step": _THIS_PROCESS["resumed_from_step"], "first_step_end_time": ends[0],
            "step_times_s": [later - sooner for sooner, later in zip(ends, ends[1:])]}
