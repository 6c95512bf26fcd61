"""SplitLayer marks a cut of a functional model into pipeline stages: everything computed from its output
belongs to the next stage. Users import it as tarantella.keras.layers.SplitLayer (the Keras face); it lives
with pipelining, which is what gives it a meaning."""
from __future__ import annotations

import keras

__all__ = ["SplitLayer"]


@keras.saving.register_keras_serializable(package="tarantella")
class SplitLayer(keras.layers.Layer):
    """Identity on one tensor; the tensor crosses from one pipeline stage to the next.

    Several tensors cross a cut: give each its own SplitLayer. Without
    pipelining (or in a plain Keras model) it does nothing, so a model with
    SplitLayers saves, loads and trains serially as usual."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        check_single_tensor(self.name, inputs)
        return inputs


def check_single_tensor(name: str, inputs) -> None:
    count = len(keras.tree.flatten(inputs))
    if count != 1:
        raise ValueError(
            f"tarantella: SplitLayer {name!r} got {count} tensors, but a SplitLayer takes exactly one input and "
            f"has one output; to cut across several tensors, give each tensor its own SplitLayer "
            f"(e.g. `a = SplitLayer()(a); b = SplitLayer()(b)`)")
