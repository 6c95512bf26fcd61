"""What tnt.Model (model.py) takes from the Keras model it wraps: its layers, inputs and outputs, its call, its
summary and config; the weights are the wrapped model's too (with shard="weights" each rank holds only its own,
tarantella/sharding/sharded_model.py)."""
from __future__ import annotations

import keras

__all__ = ["Wrapping"]


class Wrapping:
    """Mixed into tnt.Model before keras.Model; needs self._model (the wrapped model) and self._sharding (None
    unless sharded)."""

    def build(self, input_shape=None):
        self.built = True  # the wrapped model builds itself on its first call

    def call(self, inputs, training=None):
        return self._model(inputs, training=training)

    @property
    def wrapped_model(self) -> keras.Model:
        """The user's Keras model (shares its variables with this one)."""
        return self._model

    @property
    def layers(self):
        return self._model.layers

    def get_layer(self, name=None, index=None):
        return self._model.get_layer(name=name, index=index)

    @property
    def inputs(self):
        return self._model.inputs

    @property
    def outputs(self):
        return self._model.outputs

    def summary(self, *args, **kwargs):
        return self._model.summary(*args, **kwargs)

    def get_weights(self):
        """The wrapped model's weights; with shard="weights" a collective (each weight comes from its owner)."""
        return self._model.get_weights() if self._sharding is None else self._sharding.whole_weights()

    def set_weights(self, weights):
        """With shard="weights" each rank keeps the values of the weights it owns."""
        (self._model if self._sharding is None else self._sharding).set_weights(weights)

    def to_json(self, **kwargs):
        return self._model.to_json(**kwargs)
