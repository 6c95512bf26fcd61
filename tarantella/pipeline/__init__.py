"""Pipeline parallelism, as users reach it: a functional Keras model cut into stages on different
ranks, trained with synchronous semantics (the same update as the unpartitioned model),
optionally with data-parallel replicas of every stage.

    import tarantella as tnt
    from tarantella.keras.layers import SplitLayer
    x = SplitLayer()(x)                                   # a cut point in the functional model
    model = tnt.pipeline.make_pipelined_model(model, num_micro_batches=4, schedule="1f1b")

This package is a face, beside tarantella.keras: make_pipelined_model and load_model here,
entry.py (how tnt.Model(..., PIPELINING or ALL) gets a pipelined model, or none on one rank).
The strategy itself is tarantella.pipelining; a face hands it what it needs of another strategy
(sharding's update, for shard="optimizer" over a stage's replicas).
"""
from __future__ import annotations

import functools

__all__ = ["make_pipelined_model", "PipelinedModel", "SplitLayer", "load_model"]


def make_pipelined_model(model, *, num_micro_batches: int | None = None, schedule: str = "1f1b",
                         num_pipeline_stages: int | None = None, data_parallel: bool = False, **kwargs):
    """The pipelined form of functional `model` on all ranks (a collective).

    num_micro_batches: micro-batches per replica and global batch; default (None) 4 per stage,
        where GPipe's bubble, (S-1)/(M+S-1), becomes small (1/9 for 2 stages).
    schedule: "1f1b" (less activation memory) or "gpipe"; both give the same update.
    num_pipeline_stages: with SplitLayers, must match them or be None; without, the
        model is cut automatically into that many balanced stages (default: the rank
        count, without data parallelism).
    data_parallel: replicate the pipeline over ranks // stages replicas (ParallelStrategy.ALL).
    balance_by (keyword): "time" (measured per layer, default) or "parameters".
    defer_weight_gradients (keyword): Dense layers' weight gradients computed once for several
        micro-batches in weight passes instead of in each backward (Note [Deferred weight gradients]
        in weight_gradients.py): True (one weight pass per step), False, or a number of micro-batches
        per weight pass; default None: True for "gpipe"; for "1f1b" True only where the deferred layers'
        inputs and output gradients of a step take no more memory than their weight gradients
        (Dense(W) layers: 2 x rows per replica <= W), else False (keeps its activation bound).
    """
    from tarantella.pipelining.pipelined_model import PipelinedModel
    if kwargs.get("shard") is not None:   # Note [A stage's replicas share its optimizer state] in step_collectives.py
        from tarantella.sharding.update import shard_model_optimizer
        kwargs["shard_optimizer"] = functools.partial(shard_model_optimizer, mode="optimizer")
    return PipelinedModel(model, num_micro_batches=num_micro_batches, schedule=schedule,
                          num_pipeline_stages=num_pipeline_stages, data_parallel=data_parallel, **kwargs)


def load_model(filepath, *, num_micro_batches: int | None = None, schedule: str = "1f1b",
               num_pipeline_stages: int | None = None, data_parallel: bool = False, custom_objects=None,
               compile: bool = True, **kwargs):
    """Every rank loads the `.keras` file written by PipelinedModel.save (or any Keras) and pipelines it,
    keeping its stage's weights and optimizer state: training resumes where the saved run stopped."""
    import keras
    whole = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile)
    model = make_pipelined_model(whole, num_micro_batches=num_micro_batches, schedule=schedule,
                                 num_pipeline_stages=num_pipeline_stages, data_parallel=data_parallel, **kwargs)
    if compile and whole.compiled:
        config = whole.get_compile_config() or {}
        metrics = config.get("metrics")
        loaded = whole.optimizer      # built by Keras with the file's state for the whole model
        model.compile(optimizer=loaded.__class__.from_config(loaded.get_config()), loss=whole.loss,
                      metrics=keras.saving.deserialize_keras_object(metrics) if metrics else None)
        if loaded.built:
            model.adopt_optimizer_state(loaded)   # this stage's slots only (scatter on load)
    return model


def __getattr__(name):
    if name == "PipelinedModel":
        from tarantella.pipelining.pipelined_model import PipelinedModel
        return PipelinedModel
    if name == "SplitLayer":
        from tarantella.pipelining.split_layer import SplitLayer
        return SplitLayer
    raise AttributeError(f"module 'tarantella.pipeline' has no attribute {name!r}")
