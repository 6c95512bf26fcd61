"""The Keras 3 face of tarantella: the data-parallel Model, callbacks handling, save/load."""
import tensorflow as _tf

from tarantella import devices as _devices

_devices.configure_tensorflow(_tf)

from tarantella.keras.model import Model  # noqa: E402
from tarantella.keras.parallel_strategy import ParallelStrategy  # noqa: E402
from tarantella.keras import layers, models  # noqa: E402

__all__ = ["Model", "ParallelStrategy", "layers", "models"]
