"""The spec's learning-rate schedule as a Keras schedule (warm-up, scaling, decay)."""
from __future__ import annotations

import keras
from keras import ops

from bench.specs import scaled_learning_rate

__all__ = ["SpecSchedule"]


class SpecSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """bench.specs.learning_rate_at, in Keras ops so it runs inside the compiled step."""

    def __init__(self, reference: dict, global_batch: int, steps_per_epoch: int, total_steps: int):
        self.reference = dict(reference)
        self.peak = scaled_learning_rate(reference, global_batch)
        self.warmup = float(reference.get("warmup_steps")
                            or int(reference.get("warmup_epochs", 0) * steps_per_epoch))
        self.total = float(total_steps)
        self.global_batch, self.steps_per_epoch = global_batch, steps_per_epoch

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak, warmup = self.peak, max(self.warmup, 1.0)
        warm = peak * (step + 1.0) / warmup
        decay = self.reference.get("decay", "none")
        if decay == "polynomial":
            left = max(self.total - self.warmup, 1.0)
            done = ops.minimum(ops.maximum(step - self.warmup, 0.0), left) / left
            end = self.reference.get("end_learning_rate", 0.0)
            after = end + (peak - end) * (1.0 - done) ** 2
        elif decay == "inverse_sqrt":
            after = peak * ops.sqrt(warmup / ops.maximum(step + 1.0, 1.0))
        else:
            after = ops.convert_to_tensor(peak, "float32")
        return ops.where(step < self.warmup, warm, after) if self.warmup else after

    def get_config(self):
        return {"reference": self.reference, "global_batch": self.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "total_steps": int(self.total)}
