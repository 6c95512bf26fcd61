"""Distribute training through the optimizer: a model's own train_step runs unchanged.

Note [Distributing through the optimizer]
A user's train_step (or a compute_loss override inside Keras's) computes
gradients of its loss on this rank's micro-batch and hands them to
`optimizer.apply` / `apply_gradients` (public Keras API, and the one place every
Keras training step goes through, whatever its logic). The optimizer of a
tnt.Model with such a model is wrapped here (on the instance, so the user's
references to it, its saved state and its config stay the same): inside a
tarantella step, `apply(grads, vars)` first weights this rank's gradients by
its share n_r / N of the global batch and sums them over the ranks in the fused
reducer (gradient_reduction.weighted_sum), then applies the sum. Keras's loss is
the mean over the micro-batch, so the sum is the gradient of the global batch's
loss (the argument of Note [Loss of the global batch] in tf_steps.py, moved from
the loss to the gradients). Models with several optimizers (a GAN) get each
wrapped; every `apply` call of a step has its own reducer, numbered in the order
the step calls them (the same on every rank: all ranks trace the same step).
Gradients that are None (variables the loss does not reach) stay None, as in
serial Keras, which then leaves those variables alone.
Outside a tarantella step (no StepContext) the optimizer behaves as before.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable

import keras

from tarantella.step import gradient_reduction
from tarantella.timeline import graph_marks

__all__ = ["StepContext", "step_context", "distribute_optimizer"]

_local = threading.local()


@dataclasses.dataclass
class StepContext:
    share: object                               # this rank's n_r / N, a scalar tensor of the step
    allreducer_for: Callable[[list, str], object]  # (tensors, purpose) -> GraphAllreducer
    overlap: bool = True
    applies: int = 0                            # apply calls traced so far in this step
    first_allreducer: object = None             # for tnt.Model.communication_profile


@contextlib.contextmanager
def step_context(context: StepContext):
    """Within: wrapped optimizers reduce their gradients (set while tracing a tnt.Model step)."""
    previous = getattr(_local, "context", None)
    _local.context = context
    try:
        yield context
    finally:
        _local.context = previous


def distribute_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """Wrap `optimizer.apply` in place (idempotent); returns the optimizer."""
    if getattr(optimizer, "_tnt_distributed", False):
        return optimizer
    local_apply = optimizer.apply

    def apply(grads, trainable_variables=None):
        context = getattr(_local, "context", None)
        if context is None:
            return local_apply(grads, trainable_variables)
        if trainable_variables is None:
            raise ValueError("tarantella: call optimizer.apply(grads, variables) with the variables inside a "
                             "distributed train_step: the gradients are reduced per variable")
        grads, variables = list(grads), list(trainable_variables)
        present = [index for index, grad in enumerate(grads) if grad is not None]
        purpose = f"gradients:{context.applies}"
        context.applies += 1
        if getattr(optimizer, "_tnt_shards", None) == "weights":
            # summed on their owners by the backward pass (Note [Weights gathered for a model's own train_step])
            applied = local_apply(grads, variables)
            graph_marks.mark_after_updates(variables)  # timeline only
            return applied

        def allreducer_for(tensors):
            allreducer = context.allreducer_for(tensors, purpose)
            if context.first_allreducer is None:
                context.first_allreducer = allreducer
            return allreducer

        from tarantella.sharding.update import reduction_to_owners  # it imports this module
        to_owners = reduction_to_owners(optimizer, variables)  # ZeRO stage 2, else None
        summed = gradient_reduction.weighted_sum([grads[i] for i in present], [variables[i] for i in present],
                                                 context.share, allreducer_for, context.overlap, to_owners)
        for index, grad in zip(present, summed):
            grads[index] = grad
        applied = local_apply(grads, variables)
        graph_marks.mark_after_updates(variables)  # timeline only
        return applied

    optimizer.apply = apply
    optimizer._tnt_distributed = True
    return optimizer
