"""Every rank starts from the master rank's weights, seeded or not, and from its random layers' seed states:
serial-equal draws need the master's seeds on every rank (Note [Random values by sample, not by rank] in
serial_random.py)."""
from __future__ import annotations

import numpy as np

from tarantella import collectives, runtime

__all__ = ["take_from_master"]


def take_from_master(model) -> None:
    """Collectively: `model`'s weights, then its other variables (seed states), broadcast from the master rank."""
    root = runtime.get_master_rank()
    model.set_weights([collectives.broadcast(np.array(weight, copy=True), root=root) for weight in model.get_weights()])
    weights = {id(weight) for weight in model.weights}
    for variable in model.variables:
        if id(variable) not in weights:
            variable.assign(collectives.broadcast(np.array(variable.numpy(), copy=True), root=root))
