"""Transformer sizes (Vaswani et al. 2017, table 3), apart from the model so naming one imports no Keras."""
from __future__ import annotations

import dataclasses

__all__ = ["TransformerSize", "BASE", "BIG", "SMALL", "TINY"]


@dataclasses.dataclass(frozen=True)
class TransformerSize:
    layers: int          # encoder layers, and decoder layers
    d_model: int
    d_ff: int
    heads: int
    dropout: float


BASE = TransformerSize(layers=6, d_model=512, d_ff=2048, heads=8, dropout=0.1)
BIG = TransformerSize(layers=6, d_model=1024, d_ff=4096, heads=16, dropout=0.3)
SMALL = TransformerSize(layers=2, d_model=256, d_ff=1024, heads=4, dropout=0.1)   # fits a laptop
TINY = TransformerSize(layers=1, d_model=32, d_ff=64, heads=2, dropout=0.1)       # tests
