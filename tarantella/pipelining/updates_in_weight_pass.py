"""A stage's optimizer updates applied layer by layer in its last weight pass.

Note [Updates in the weight pass]
With deferred weight gradients (Note [Deferred weight gradients] in
weight_gradients.py) the step's last weight pass makes every deferred layer's
weight gradient: one product per layer, none waiting for another, so
TensorFlow runs them as soon as it can, and every weight gradient of the stage
exists before the first update consumes one (8 x Dense(2048), 2 stages: 64 MiB
of gradients, and the updates' temporaries beside them). Where nothing in the
update needs the stage's gradients together, the last weight pass instead
updates each layer's variables as soon as its gradient is made, and the next
layer's product waits for that update: one layer's gradient at a time.

Nothing needs them together when the stage has one replica (no allreduce of
its gradients), the step decides nothing across the stages or over the stage
(global_clipnorm, a LossScaleOptimizer's skip), the optimizer keeps no EMA
(Keras averages every variable at each apply) and accumulates no gradients
(its reset clears every accumulator at once), and its apply is Keras's own.

Keras's apply advances the iteration count once per call. Each layer's call is
followed by taking that step back, and the step's last apply (the stage's
other variables, or the count alone) advances it once: every update reads the
step's count, as one apply would (learning-rate schedules, Adam's bias
correction), and the per-variable update is Keras's own arithmetic: the
same bits (tests/pipeline/test_updates_in_weight_pass.py).

The first stage then takes no weight pass before its last backward (Note
[The first stage's weight passes] in schedules.py): that pass would make
every weight gradient of the stage before the last micro-batch's and hold
them over the wait. Measured (8 x Dense(2048), Adam, 2 stages, M = 8, batch
128, `tarantella -n 2`; `python -m bench.pipeline.defaults --widths 2048
--batches 128 --repeats 1` at the commits before and with this, under that
benchmark's earlier peak measure): the largest rank's peak growth 419 -> 339
MiB. Speed: `python -m bench.pipeline.defaults --repeats 3` before and after
(results/pipeline_defaults) differ within the day's noise (8 x Dense(512),
batch 128: 0.66 and 0.65 of the ideal speed-up).
"""
from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["UpdatesInWeightPass", "updates_in_weight_pass"]


def updates_in_weight_pass(optimizer, num_replicas: int, decides_across_stages: bool) -> bool:
    """Whether a stage's updates can run layer by layer in its last weight pass (Note [Updates in the weight
    pass])."""
    return (num_replicas == 1 and not decides_across_stages and not hasattr(optimizer, "inner_optimizer")
            and isinstance(optimizer, keras.optimizers.Optimizer)
            and type(optimizer).apply is keras.optimizers.Optimizer.apply
            and not optimizer.global_clipnorm and not optimizer.use_ema
            and not optimizer.gradient_accumulation_steps)


class UpdatesInWeightPass:
    """Traced, within one step: `update` applies the optimizer to a layer's variables as the weight pass makes
    their gradients; `finish` applies it to the rest and advances the iteration count once."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._updated = set()

    def update(self, gradients: list, variables: list, after: list) -> list:
        """The update of `variables` (after the tokens `after`); returns their new values, what the weight
        pass's next product waits for."""
        with tf.control_dependencies(after):
            self.optimizer.apply(gradients, variables)
            self.optimizer.iterations.assign_sub(1)
        self._updated.update(id(v) for v in variables)
        return [tf.convert_to_tensor(v) for v in variables]

    def finish(self, gradients: list, variables: list) -> None:
        rest = [(g, v) for g, v in zip(gradients, variables) if id(v) not in self._updated]
        if rest:
            self.optimizer.apply([g for g, _ in rest], [v for _, v in rest])
        elif self._updated:
            self.optimizer.iterations.assign_add(1)
