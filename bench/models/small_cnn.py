"""A small CNN for 8x8 grey images (sklearn's digits): the mini benchmark's model."""
from __future__ import annotations

import keras
from keras import layers

__all__ = ["small_cnn"]


def small_cnn(image_size: int = 8, num_classes: int = 10, name: str = "small_cnn") -> keras.Model:
    inputs = keras.Input((image_size, image_size, 1), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(2, name="pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(64, activation="relu", name="hidden")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)
