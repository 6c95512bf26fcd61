"""Every rank starts from the master rank's weights, seeded or not, and from its random layers' seed states:
serial-equal draws need the master's seeds on every rank (Note [Random values by sample, not by rank] in
serial_random.py). broadcast_into is the one way variables take another rank's values (tnt.broadcast_variables,
a pipeline's and a sharded model's eagerly built weights)."""
from __future__ import annotations

import numpy as np

from tarantella import collectives, runtime

__all__ = ["broadcast_into", "take_from_master"]


def broadcast_into(variables, root: int | None = None) -> None:
    """Collectively, in the order given: every rank's `variables` take root's values (default: the master's)."""
    root = runtime.get_master_rank() if root is None else root
    for variable in variables:
        value = collectives.broadcast(np.array(variable.numpy(), copy=True), root=root)
        if runtime.get_rank() != root:
            variable.assign(value)


def take_from_master(model) -> None:
    """Collectively: `model`'s weights, then its other variables (seed states), from the master rank."""
    weights = {id(weight) for weight in model.weights}
    broadcast_into(list(model.weights) + [v for v in model.variables if id(v) not in weights])
