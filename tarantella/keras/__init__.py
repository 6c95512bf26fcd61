"""The Keras 3 face of tarantella: the data-parallel Model, callbacks handling, save/load."""
from tarantella.keras.model import Model
from tarantella.keras.parallel_strategy import ParallelStrategy
from tarantella.keras import models

__all__ = ["Model", "ParallelStrategy", "models"]
