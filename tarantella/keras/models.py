"""Loading saved models as distributed models, and taking over a model's compile settings."""
from __future__ import annotations

import keras

from tarantella.keras.parallel_strategy import ParallelStrategy

__all__ = ["load_model", "compile_like", "unbuilt_copy"]


def compile_like(distributed, model: keras.Model) -> None:
    """Compile `distributed` as `model` was compiled, sharing its optimizer (and optimizer state)."""
    config = keras.saving.deserialize_keras_object(model.get_compile_config() or {})
    config["optimizer"] = model.optimizer
    distributed.compile(**config)


def unbuilt_copy(optimizer):
    """A new optimizer configured as `optimizer`, without its state (the whole model's optimizer that a pipeline
    stage or a sharded rank writes into when saving). Keras's config leaves out the weight-decay exclusions
    (exclude_from_weight_decay), which the copy keeps."""
    copy = optimizer.__class__.from_config(optimizer.get_config())
    for source, target in ((optimizer, copy), (getattr(optimizer, "inner_optimizer", None),
                                               getattr(copy, "inner_optimizer", None))):
        for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
            if source is not None and hasattr(source, name):
                setattr(target, name, getattr(source, name))
    return copy


def load_model(filepath, custom_objects=None, compile=True, parallel_strategy=ParallelStrategy.DATA,
               shard=None, **kwargs):
    """Every rank loads the `.keras` file (it must be readable by all ranks) and wraps it in a
    tnt.Model; a compiled model stays compiled, with its optimizer state (with shard="optimizer", each rank
    keeps its own share of that state from the first fit on)."""
    from tarantella.keras.model import Model
    model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile, **kwargs)
    return Model(model, parallel_strategy=parallel_strategy, shard=shard)
