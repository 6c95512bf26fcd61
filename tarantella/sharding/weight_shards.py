"""Sharding a model's weights (ZeRO stage 3, shard="weights", Note [Weights gathered layer by layer] in
gathered_weights.py): which layers run as gathered units, whether every weight is read inside one of them, and
the collective set-up that gives each rank storage for its own weights only."""
from __future__ import annotations

import logging

import keras

from tarantella import deferred_build, stage_state
from tarantella.sharding.gathered_weights import WeightGathering
from tarantella.sharding.owners import assign_owners, describe, variable_bytes
from tarantella.step import initial_weights

__all__ = ["units_of", "check_gatherable", "shard_weights"]

logger = logging.getLogger("tarantella")


def units_of(model) -> list:
    """The layers whose `call` runs as one gathered unit: the top-level layers that hold trainable variables,
    looking inside nested Functional and Sequential models (their call only calls their layers)."""
    units = []
    for layer in model.layers:
        if isinstance(layer, keras.Model) and _is_graph_model(layer):
            units.extend(units_of(layer))
        elif layer.trainable_variables:
            units.append(layer)
    return units


def _is_graph_model(model) -> bool:
    return isinstance(model, (keras.Sequential, keras.src.models.functional.Functional))


def check_gatherable(model, units: list) -> None:
    """A one-line error if some weight would be read outside the units' calls (Note [Weights gathered
    layer by layer] in gathered_weights.py)."""
    by_unit = {}
    for unit in units:
        for variable in unit.trainable_variables:
            if id(variable) in by_unit:
                raise ValueError(f"tarantella: shard='weights' gathers each layer's weights for its own call, and "
                                 f"{variable.path} is shared by layers {by_unit[id(variable)]!r} and {unit.name!r}; "
                                 f"use shard='gradients' for models that share weights between layers")
            by_unit[id(variable)] = unit.name
    outside = [v.path for v in model.trainable_variables if id(v) not in by_unit]
    if outside:
        raise ValueError(f"tarantella: shard='weights' gathers the weights of {type(model).__name__}'s layers, and "
                         f"{outside[:3]} belong to no layer it calls; use shard='gradients' for this model")
    regularized = [v.path for v in model.trainable_variables if getattr(v, "regularizer", None) is not None]
    if regularized:
        raise ValueError(f"tarantella: shard='weights' cannot apply the weight regularizers of {regularized[:3]} "
                         f"(Keras reads them outside the layers, where only the owner holds the weight); use the "
                         f"optimizer's weight_decay, or shard='gradients'")


def shard_weights(model, rank: int, size: int) -> WeightGathering:
    """Collective, when tnt.Model wraps `model` with shard="weights": each rank gives storage to the weights it
    owns (initialised as serial Keras would, Note [Models built without storage] in deferred_build.py, or the
    master's values for a model built eagerly) and releases the others; every unit's call is gathered from then on."""
    if not model.built:
        raise ValueError(f"tarantella: shard='weights' shards the weights of a built model, and "
                         f"{type(model).__name__} is not built; give it an Input (or call it on a batch, or build it "
                         f"inside tnt.deferred_weights()) before tnt.Model")
    units = units_of(model)
    check_gatherable(model, units)
    variables = list(model.trainable_variables)
    owners = assign_owners([variable_bytes(v) for v in variables], size)
    owned = {id(v) for v, owner in zip(variables, owners) if owner == rank}
    trainable = {id(v) for v in variables}
    deferred = [v for v in model.variables if deferred_build.is_deferred(v)]
    built = [v for v in model.variables if not deferred_build.is_deferred(v)]
    initial_weights.broadcast_into(built)   # an eagerly built model: every rank starts from the master's values
    deferred_build.take_master_seeds(deferred)
    for variable in deferred:
        if id(variable) in owned or id(variable) not in trainable:
            deferred_build.initialize(variable)
    for variable in variables:
        if id(variable) not in owned:
            stage_state.release(variable)
    logger.info("tarantella: shard='weights': %s, %d layers gathered per pass",
                describe([variable_bytes(v) for v in variables], owners, size), len(units))
    gathering = WeightGathering(variables, owners, rank, size)
    if size > 1:   # one rank holds every weight: its layers run as they are
        gathering.install(units)
    for variable in variables:
        variable._tnt_gathering = gathering
    return gathering
