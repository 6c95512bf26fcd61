"""The two ways a benchmark program trains: tarantella (`tnt.Model`) or plain Keras.

`keras` is the comparison baseline: every rank trains its own copy on its micro-batch
and no gradients are exchanged, so it shows the compute-only scaling that data
parallelism can at best reach on this machine.
"""
from __future__ import annotations

__all__ = ["FRAMEWORKS", "FrameworkMissing", "wrap_model"]

FRAMEWORKS = ("tnt", "keras")


class FrameworkMissing(RuntimeError):
    """The requested framework cannot run in this installation."""


def wrap_model(keras_model, framework: str):
    if framework == "keras":
        return keras_model
    import tarantella as tnt
    if not hasattr(tnt, "Model"):
        raise FrameworkMissing(
            "this tarantella has no tnt.Model yet (the data-parallel Keras wrapper); "
            "run the sweep with --framework keras until it is installed")
    return tnt.Model(keras_model)


def batch_per_dataset(framework: str, global_batch: int, ranks: int) -> int:
    """The batch each rank's dataset yields: tnt.Model takes the global batch and
    splits it; plain Keras ranks batch their own share."""
    return global_batch if framework == "tnt" else global_batch // ranks
