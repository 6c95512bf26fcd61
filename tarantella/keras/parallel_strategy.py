"""How a tnt.Model spreads training over the ranks."""
from __future__ import annotations

import enum

__all__ = ["ParallelStrategy"]


class ParallelStrategy(enum.Flag):
    """DATA: every rank holds the whole model and trains on its part of each global batch.
    PIPELINING: the model is cut at SplitLayers into stages on different ranks (see tarantella.pipeline).
    ALL: both."""
    DATA = enum.auto()
    PIPELINING = enum.auto()
    ALL = DATA | PIPELINING
