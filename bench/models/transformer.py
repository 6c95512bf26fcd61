"""The Transformer of Vaswani et al. (2017), encoder-decoder, in Keras 3.

Post-layer-norm as in the paper; sinusoidal positions; one embedding table shared by
source, target and the output projection (a shared source/target vocabulary, as the
WMT14 en-de reference uses). Token id 0 is padding: it is masked in attention.
Inputs: {"source": int[batch, len], "target_in": int[batch, len]}; output: logits
over the vocabulary for each target position.
"""
from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from bench.models.transformer_sizes import BASE, BIG, TransformerSize

__all__ = ["TransformerSize", "BASE", "BIG", "transformer"]


def _positions(length: int, d_model: int) -> np.ndarray:
    position = np.arange(length)[:, None]
    rate = np.exp(-np.log(10000.0) * (np.arange(0, d_model, 2) / d_model))
    table = np.zeros((length, d_model), dtype="float32")
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate)
    return table


class SharedEmbedding(layers.Layer):
    """Token embedding scaled by sqrt(d_model) plus positions; TiedProjection reuses the table."""

    def __init__(self, vocab_size, d_model, max_length, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.max_length = vocab_size, d_model, max_length
        self.positions = _positions(max_length, d_model)

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.vocab_size, self.d_model), name="table",
                                     initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))

    def call(self, ids):
        length = ops.shape(ids)[1]
        x = ops.take(self.table, ids, axis=0) * (self.d_model ** 0.5)
        return x + ops.convert_to_tensor(self.positions, dtype=x.dtype)[None, :length]  # a mixed policy: x is 16-bit

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "max_length": self.max_length}


class TiedProjection(layers.Layer):
    """Logits from the embedding table (weight tying); the table stays the embedding's."""

    def __init__(self, embedding: SharedEmbedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return ops.matmul(x, ops.transpose(self.embedding.table))


def _feed_forward(x, size, name):
    y = layers.Dense(size.d_ff, activation="relu", name=f"{name}_ff1")(x)
    y = layers.Dense(size.d_model, name=f"{name}_ff2")(y)
    return layers.Dropout(size.dropout, name=f"{name}_ff_drop")(y)


def _attention(query, value, mask, size, name, causal=False):
    y = layers.MultiHeadAttention(size.heads, size.d_model // size.heads, dropout=size.dropout,
                                  name=f"{name}_mha")(query, value, attention_mask=mask,
                                                      use_causal_mask=causal)
    return layers.Dropout(size.dropout, name=f"{name}_drop")(y)


def _add_norm(x, y, name):
    return layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm")(layers.Add(name=f"{name}_add")([x, y]))


def transformer(size: TransformerSize = BASE, vocab_size: int = 33708, max_length: int = 256,
                name: str = "transformer") -> keras.Model:
    source = keras.Input((None,), dtype="int32", name="source")
    target_in = keras.Input((None,), dtype="int32", name="target_in")
    embed = SharedEmbedding(vocab_size, size.d_model, max_length, name="embedding")
    source_keep = layers.Lambda(lambda s: ops.not_equal(s, 0)[:, None, :], name="source_mask")(source)
    target_keep = layers.Lambda(lambda t: ops.not_equal(t, 0)[:, None, :], name="target_mask")(target_in)

    x = layers.Dropout(size.dropout, name="encoder_in_drop")(embed(source))
    for i in range(size.layers):
        x = _add_norm(x, _attention(x, x, source_keep, size, f"enc{i}_self"), f"enc{i}_self")
        x = _add_norm(x, _feed_forward(x, size, f"enc{i}"), f"enc{i}_ff")
    memory = x

    y = layers.Dropout(size.dropout, name="decoder_in_drop")(embed(target_in))
    for i in range(size.layers):
        y = _add_norm(y, _attention(y, y, target_keep, size, f"dec{i}_self", causal=True), f"dec{i}_self")
        y = _add_norm(y, _attention(y, memory, source_keep, size, f"dec{i}_cross"), f"dec{i}_cross")
        y = _add_norm(y, _feed_forward(y, size, f"dec{i}"), f"dec{i}_ff")
    logits = TiedProjection(embed, name="logits")(y)
    return keras.Model({"source": source, "target_in": target_in}, logits, name=name)
