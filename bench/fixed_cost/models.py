"""The models of the fixed-cost benchmark and their synthetic data."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

__all__ = ["FixedCostModel", "MODELS", "get"]


@dataclasses.dataclass(frozen=True)
class FixedCostModel:
    name: str
    description: str
    build: Callable            # () -> an uncompiled keras.Model
    input_shape: tuple         # one sample
    classes: int

    def data(self, samples: int, seed: int = 1):
        """(x, y): standard-normal inputs and uniform labels."""
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((samples, *self.input_shape)).astype(np.float32)
        y = rng.integers(0, self.classes, size=samples).astype(np.int32)
        return x, y


def _mlp8x512():
    import keras
    layers = [keras.Input((512,))]
    layers += [keras.layers.Dense(512, activation="relu") for _ in range(7)] + [keras.layers.Dense(512)]
    return keras.Sequential(layers, name="mlp8x512")


def _digits_mlp():
    """examples/mlp_numpy.py's model (sklearn's 8x8 digits as 64 features)."""
    import keras
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)],
                            name="digits_mlp")


def _resnet50_small():
    from bench.models.registry import get_model_entry
    return get_model_entry("resnet50_small").build()


MODELS = {
    "mlp8x512": FixedCostModel("mlp8x512", "8 x Dense(512), 2.1 M parameters, 512 classes", _mlp8x512, (512,), 512),
    "digits_mlp": FixedCostModel("digits_mlp", "Dense(32)-Dense(10) on 64 features (examples/mlp_numpy.py)",
                                 _digits_mlp, (64,), 10),
    "resnet50_small": FixedCostModel("resnet50_small", "ResNet-50 on 32x32 images, 1000 classes (bench.models)",
                                     _resnet50_small, (32, 32, 3), 1000),
}


def get(name: str) -> FixedCostModel:
    try:
        return MODELS[name]
    except KeyError:
        raise SystemExit(f"bench.fixed_cost: unknown model {name!r}; choose from {sorted(MODELS)}") from None
