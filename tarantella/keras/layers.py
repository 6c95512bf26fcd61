"""Layers with a meaning for tarantella, as users import them: SplitLayer marks a cut of a functional model
into pipeline stages (tarantella/pipelining/split_layer.py)."""
from tarantella.pipelining.split_layer import SplitLayer

__all__ = ["SplitLayer"]
