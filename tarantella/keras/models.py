"""Loading saved models as distributed models, and taking over a model's compile settings."""
from __future__ import annotations

import keras

from tarantella.keras.parallel_strategy import ParallelStrategy

__all__ = ["load_model", "compile_like"]


def compile_like(distributed, model: keras.Model) -> None:
    """Compile `distributed` as `model` was compiled, sharing its optimizer (and optimizer state)."""
    config = keras.saving.deserialize_keras_object(model.get_compile_config() or {})
    config["optimizer"] = model.optimizer
    distributed.compile(**config)


def load_model(filepath, custom_objects=None, compile=True, parallel_strategy=ParallelStrategy.DATA,
               shard=None, **kwargs):
    """Every rank loads the `.keras` file (it must be readable by all ranks) and wraps it in a
    tnt.Model; a compiled model stays compiled, with its optimizer state (with shard="optimizer", each rank
    keeps its own share of that state from the first fit on)."""
    from tarantella.keras.model import Model
    model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile, **kwargs)
    return Model(model, parallel_strategy=parallel_strategy, shard=shard)
