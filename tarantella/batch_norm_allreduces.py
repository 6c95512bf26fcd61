"""The allreduces BatchNormalization's global statistics make per layer and step, in plain Python: the layer
(tarantella/step/global_batch_norm.py) follows this plan and the simulator (bench/simulate/step_model.py) charges it.

Forward: every rank's (count, sum, squared deviations) of C channels gathered in ONE allreduce of N x (2C + 1)
values while that is at most GATHERED_VALUES_LIMIT (16 Ki values, 64 KiB in float32); else, or with a mask,
two passes (sum and count: C + 1 values; squared deviations: C). Backward: the gradients of the mean and the
variance in one allreduce of 2C values. Note [BatchNormalization over the global batch] says why.
"""
from __future__ import annotations

__all__ = ["GATHERED_VALUES_LIMIT", "gathered", "allreduce_values"]

GATHERED_VALUES_LIMIT = 16 * 1024


def gathered(world_size: int, channels: int) -> bool:
    """Whether the forward statistics travel in one gathered allreduce."""
    return world_size * (2 * channels + 1) <= GATHERED_VALUES_LIMIT


def allreduce_values(channels: int, world_size: int, masked: bool = False) -> tuple[list[int], list[int]]:
    """(forward, backward): the values of each allreduce of one layer in one training step."""
    forward = [world_size * (2 * channels + 1)] if not masked and gathered(world_size, channels) \
        else [channels + 1, channels]
    return forward, [2 * channels]
