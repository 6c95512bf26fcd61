"""Loading saved models as distributed models."""
from __future__ import annotations

import keras

from tarantella.keras.model import Model
from tarantella.keras.parallel_strategy import ParallelStrategy

__all__ = ["load_model"]


def load_model(filepath, custom_objects=None, compile=True, parallel_strategy=ParallelStrategy.DATA,
               **kwargs) -> Model:
    """Every rank loads the `.keras` file (it must be readable by all ranks) and wraps it in a
    tnt.Model; a compiled model keeps its optimizer and optimizer state."""
    model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile, **kwargs)
    distributed = Model(model, parallel_strategy=parallel_strategy)
    if compile and model.compiled:
        config = model.get_compile_config() or {}
        metrics = config.get("metrics")
        distributed.compile(optimizer=model.optimizer, loss=model.loss,
                            metrics=keras.saving.deserialize_keras_object(metrics) if metrics else None)
    return distributed
