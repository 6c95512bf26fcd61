"""Helpers of the tnt-bench tests (a module name of its own: `bench` is the package under test)."""
from __future__ import annotations


def fake_profile(model: str = "resnet_tiny", tensors: int = 20, tensor_bytes: int = 40_000) -> dict:
    """A profile as train_benchmark.py writes it, with round numbers (no TensorFlow needed)."""
    gradients = [{"name": f"layer{i}/kernel", "shape": [tensor_bytes // 4], "bytes": tensor_bytes,
                  "layer": f"layer{i}", "ready_fraction": (i + 1) / tensors} for i in range(tensors)]
    return {"model": model, "micro_batch": 8, "step_s": 0.1, "forward_s": 0.03, "backward_s": 0.06,
            "update_s": 0.01, "fixed_s": 0.02, "per_example_s": 0.01, "gradients": gradients}
