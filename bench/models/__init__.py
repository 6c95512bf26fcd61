"""Benchmark models written in Keras 3, and the registry that names them."""
from bench.models.registry import MODELS, ModelEntry, get_model_entry

__all__ = ["MODELS", "ModelEntry", "get_model_entry"]
