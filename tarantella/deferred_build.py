"""Build a model without giving its weights storage; each rank then gives storage to the part it holds.

    with tnt.deferred_weights():
        model = build_model()            # no weight takes memory yet
    model = tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.PIPELINING)  # this rank's stage only

Note [Models built without storage]
A pipeline rank needs only its stage's weights, but a Keras model creates every variable, with its initial
values, while it is built: each rank would first hold the whole model (and a model larger than one rank's
memory could not be built at all). Inside `deferred_weights()` (Keras's own StatelessScope, which leaves
variables uninitialised: `_value` None, `_initializer` kept, the state Keras gives variables for JAX's
stateless tracing) the model is built with shapes, names, layers and config as usual and no storage. The
wrapper then initialises only what this rank holds (`initialize`) and leaves the rest released
(Note [Releasing a variable] in tarantella/stage_state.py); tnt.Model's data parallelism
initialises everything.
Initial values equal serial Keras's: Keras draws an initializer's seed when the initializer is made (from
Python's `random`, which keras.utils.set_random_seed seeds), not when it runs, and its draws are stateless
given that seed, so initialising later, or only a part, draws the same values. `take_master_seeds` gives
every rank the master's seeds, so that an unseeded program still starts every rank from the values the
master would have drawn, as the broadcast of whole initial weights does for models built eagerly.
The scope takes its variables out of Keras's list of variables to initialise at the end of the outermost
stateless scope, so that no later scope of Keras's initialises them all.
"""
from __future__ import annotations

import contextlib

from keras.src.backend.common import global_state
from keras.src.backend.common.stateless_scope import StatelessScope, in_stateless_scope

from tarantella import collectives, runtime, stage_state

__all__ = ["deferred_weights", "is_deferred", "initialize", "take_master_seeds", "initialize_all"]

_KERAS_LIST = "uninitialized_variables"


@contextlib.contextmanager
def deferred_weights():
    """Build a model inside: its variables get shapes and initializers, and no storage yet."""
    if in_stateless_scope():
        raise RuntimeError("tarantella: deferred_weights() cannot be used inside another stateless scope")
    before = list(global_state.get_global_attribute(_KERAS_LIST, [], set_to_default=True))
    try:
        with StatelessScope(initialize_variables=False):
            yield
    finally:
        known = {id(v) for v in before}
        global_state.set_global_attribute(
            _KERAS_LIST, [v for v in global_state.get_global_attribute(_KERAS_LIST, []) if id(v) in known])


def is_deferred(variable) -> bool:
    """Built in deferred_weights() and not initialised yet (a released variable is not deferred)."""
    return (getattr(variable, "_value", 0) is None and getattr(variable, "_initializer", None) is not None
            and not stage_state.was_released(variable))


def initialize(variable) -> None:
    """Give a deferred variable storage holding its initial value."""
    variable._deferred_initialize()


def take_master_seeds(variables: list) -> None:
    """Collective (same variables, in the same order, on every rank): the initializers of `variables` draw
    with the master rank's seeds (Note [Models built without storage])."""
    if runtime.get_size() == 1 or not variables:  # the same model on every rank: all return here or none
        return
    seeds = [_seed_of(v) for v in variables]
    masters = collectives.broadcast_object(seeds, root=runtime.get_master_rank())
    for variable, seed in zip(variables, masters):
        if seed is not None and _seed_of(variable) is not None:
            variable._initializer.seed = seed


def initialize_all(model) -> None:
    """Collective: every deferred variable of `model` gets storage (data parallelism holds them all)."""
    deferred = [v for v in model.variables if is_deferred(v)]
    take_master_seeds(deferred)
    for variable in deferred:
        initialize(variable)


def _seed_of(variable):
    seed = getattr(getattr(variable, "_initializer", None), "seed", None)
    return seed if isinstance(seed, int) else None
