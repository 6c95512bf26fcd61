"""The sharding benchmarks' models (bench/sharding/program.py trains them; bench/sharding/simulate.py profiles them):
- mlp: `depth` x Dense(width, relu) and Dense(10), on random vectors;
- transformer: a decoder-style language model of Keras layers: Embedding(VOCABULARY, width), `depth` blocks of
  MultiHeadAttention (width / 64 heads of 64, causal) and a feed-forward Dense(4 width) - Dense(width), each
  with a residual and LayerNormalization, and Dense(VOCABULARY) logits; TOKENS tokens per sample."""
from __future__ import annotations

import keras
import numpy as np

__all__ = ["VOCABULARY", "TOKENS", "build", "random_data"]

VOCABULARY, TOKENS = 8000, 32


def _mlp(width: int, depth: int) -> keras.Model:
    layers = [keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def _transformer(width: int, depth: int) -> keras.Model:
    tokens = keras.Input((TOKENS,), dtype="int32")
    hidden = keras.layers.Embedding(VOCABULARY, width)(tokens)
    for _ in range(depth):
        attended = keras.layers.MultiHeadAttention(width // 64, 64)(hidden, hidden, use_causal_mask=True)
        hidden = keras.layers.LayerNormalization()(hidden + attended)
        fed = keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(hidden))
        hidden = keras.layers.LayerNormalization()(hidden + fed)
    return keras.Model(tokens, keras.layers.Dense(VOCABULARY)(hidden))


def build(model: str, width: int, depth: int) -> keras.Model:
    return _mlp(width, depth) if model == "mlp" else _transformer(width, depth)


def random_data(model: str, width: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if model == "mlp":
        return (rng.standard_normal((samples, width)).astype(np.float32),
                rng.integers(0, 10, samples).astype(np.int32))
    return (rng.integers(0, VOCABULARY, (samples, TOKENS)).astype(np.int32),
            rng.integers(0, VOCABULARY, (samples, TOKENS)).astype(np.int32))
