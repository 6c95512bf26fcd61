"""`class_weight` by Keras's rules, as sample weights: for arrays (before batching) and tf.data datasets.

Keras's rules (keras.Model.fit): a sample's class is argmax(y) for one-hot
targets (last dimension > 1), else round(y) as an integer; classes missing from
the dict weigh 1; the weights become the batch's sample weights. Refused, as in
Keras: a dataset that already carries sample weights, and several outputs.
The weights are applied to the global batch before tarantella cuts it into
micro-batches, so every rank weighs its samples as serial Keras would.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["with_class_weights", "array_sample_weights"]


def _table(class_weight: dict) -> list[float]:
    if not all(isinstance(key, int) or hasattr(key, "__index__") for key in class_weight):
        raise ValueError(f"tarantella: class_weight keys must be integer class ids, got {sorted(class_weight)!r}")
    return [float(class_weight.get(c, 1.0)) for c in range(int(max(class_weight)) + 1)]


def array_sample_weights(y, sample_weight, class_weight: dict):
    """The sample weights of array targets `y` (numpy), by the rules above."""
    if sample_weight is not None:
        raise ValueError("tarantella: pass class_weight or sample_weight, not both (as in Keras)")
    if y is None or tf.nest.is_nested(y):
        raise ValueError("tarantella: class_weight is only supported for models with a single output and "
                         "targets `y` (as in Keras)")
    y = np.asarray(y)
    if y.ndim > 1:
        y = y.argmax(axis=-1) if y.shape[-1] != 1 else y.squeeze(-1)
    classes = np.round(y).astype(np.int64)
    table = np.asarray(_table(class_weight), dtype=np.float32)
    if classes.size and (classes.min() < 0 or classes.max() >= len(table)):
        raise ValueError(f"tarantella: class_weight has no entry for class {int(classes.max())} (keys up to "
                         f"{len(table) - 1}); give every class in y a weight")
    return table[classes]


def with_class_weights(dataset: tf.data.Dataset, class_weight: dict) -> tf.data.Dataset:
    """`dataset` (elements (x, y)) with the elements (x, y, class weight of each sample)."""
    if not class_weight:
        return dataset
    if not all(isinstance(key, int) or hasattr(key, "__index__") for key in class_weight):
        raise ValueError(f"tarantella: class_weight keys must be integer class ids, got {sorted(class_weight)!r}")
    _check_structure(dataset.element_spec)
    table = tf.constant([float(class_weight.get(c, 1.0)) for c in range(int(max(class_weight)) + 1)])

    def add_weights(*element):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(element if len(element) > 1 else element[0])
        if y.shape.rank is not None and y.shape.rank >= 2:
            classes = tf.cond(tf.shape(y)[-1] > 1,
                              lambda: tf.argmax(y, axis=-1, output_type=tf.int32),
                              lambda: tf.cast(tf.round(tf.squeeze(y, axis=-1)), tf.int32))
        else:
            classes = tf.cast(tf.round(y), tf.int32)
        return x, y, tf.gather(table, classes)

    return dataset.map(add_weights)


def _check_structure(element_spec) -> None:
    """Keras's refusals, before any element is read (errors inside tf.data come wrapped in a trace)."""
    parts = element_spec if isinstance(element_spec, tuple) else (element_spec,)
    if len(parts) == 3:
        raise ValueError("tarantella: the dataset already has sample weights; pass class_weight or sample "
                         "weights, not both (as in Keras)")
    if len(parts) < 2 or tf.nest.is_nested(parts[1]):
        raise ValueError("tarantella: class_weight is only supported for models with a single output and a "
                         "dataset of (x, y) (as in Keras)")
