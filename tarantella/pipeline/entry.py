"""How tnt.Model(model, parallel_strategy=PIPELINING or ALL) becomes a pipelined model: on several ranks, the
PipelinedModel (pipelined_model.py); on one rank, none (Note [A pipelined model on one rank]).

Note [A pipelined model on one rank]
A pipelining script started on one rank (a serial run, tnt-repro's serial reference, a laptop) has no ranks to
put stages on: tnt.Model trains the whole model as serial Keras does (the data-parallel model on one rank),
ignoring the SplitLayers (identities) and the pipeline's arguments, and says so once. What the pipeline would do
differently is its BatchNormalization per micro-batch (Note [A pipeline's micro-batches and the layers that look
at the batch]); everything else is serial training."""
from __future__ import annotations

import logging

from tarantella import runtime

__all__ = ["PIPELINING_ARGUMENTS", "pipelined"]

logger = logging.getLogger("tarantella")

PIPELINING_ARGUMENTS = ("num_micro_batches", "schedule", "num_pipeline_stages", "balance_by",
                        "defer_weight_gradients")


def pipelined(model, *, overridden: list[str], data_parallel: bool, shard: str | None, arguments: dict):
    """The pipelined form of `model` on every rank (a collective), or None on one rank, where tnt.Model trains it
    whole. overridden: the model's own training logic (its overridden steps), which a pipeline cannot keep."""
    if overridden:
        raise ValueError(f"tarantella: pipelining cuts the model into stages and runs its own schedule, so "
                         f"{type(model).__name__}'s {', '.join(overridden)} cannot be kept; "
                         f"use ParallelStrategy.DATA for a model with its own training logic")
    if runtime.get_size() > 1:
        from tarantella.pipeline import make_pipelined_model
        return make_pipelined_model(model, data_parallel=data_parallel, shard=shard, **arguments)
    unknown = set(arguments) - set(PIPELINING_ARGUMENTS)
    if unknown:
        raise TypeError(f"tarantella: tnt.Model got unexpected arguments {sorted(unknown)}")
    logger.info("tarantella: 1 rank: pipelining needs a rank per stage; training the whole model serially "
                "(ignoring %s)", ", ".join(f"{k}={v!r}" for k, v in arguments.items()) or "the SplitLayers")
    return None
