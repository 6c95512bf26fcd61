"""Saving and restoring a model whose optimizer state is sharded (shard="optimizer").

Note [Saving and restoring sharded optimizer state]
A sharded tnt.Model compiles the wrapped (user's) model with a copy of the
optimizer that holds no state (Note [A sharded update] in update.py); it is
what a `.keras` or `.weights.h5` file of the wrapped model writes. Saving is
a collective: every rank's owned state is gathered by name into the master's
copy (built on all variables there, for the time of the write), the master
writes one ordinary file, plain Keras can load it, and the copy's storage is
released again. Restoring reads the whole state into the copy, and each rank
keeps the state of the variables it owns (a slot is named by its variable's
position in the model, so names match across ranks, whatever models a rank
built before, and across rank counts: a file written at one rank count
resumes at another). A rank that reads the file itself takes its share
and releases the rest; where only the master reads it (BackupAndRestore, whose
backup lives on the master's file system) the master sends every rank the
state by name (`share_from_master`), one variable at a time.

Note [Saving a model with its own training logic, sharded]
A model with its own train_step keeps its optimizers in its own attributes
(keras.io's GAN: d_optimizer, g_optimizer; or the compiled `optimizer`), and
sharding shards those objects in place (tnt.Model._distribute_own_optimizers),
so there is no unsharded copy that a file of the model would write. Saving
gathers each built sharded optimizer's state on the master into a whole copy
(as above) and, for the time of the write, the master's model holds the
copies under the attribute names Keras's saving walks; the file is the one
unsharded training writes. Loading the file (tnt.models.load_model) gives
optimizers built with the whole state: each is replaced by an unbuilt copy
that takes its own share when the first step builds it. Reading a file into
the running model (load_weights, BackupAndRestore) reads into whole copies
built on each sharded optimizer's variables, of which each takes its share
(BackupAndRestore: the master reads, then sends each rank its share, as
above); an optimizer not built yet keeps no state from the file, as serial
Keras's does not (Keras skips it with a warning).
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np

from tarantella import collectives, runtime, stage_state
from tarantella.step.optimizers import optimizers_of, unbuilt_copy

__all__ = ["gathered_on_master", "prepare_to_load", "take_share", "release", "share_from_master",
           "built_sharded_optimizers", "own_optimizers_gathered_on_master", "read_own_whole",
           "take_share_when_built", "pending_share"]


@contextlib.contextmanager
def gathered_on_master(part_optimizer, owned, whole_optimizer, whole_variables):
    """Collective: within, the master's `whole_optimizer` holds every rank's state (yields whether this rank is
    the master, the one that writes); after, its storage is released and the ranks meet."""
    materialized = stage_state.gather_optimizer_on_master(part_optimizer, owned, whole_optimizer, whole_variables)
    try:
        yield runtime.is_master_rank()
    finally:
        for variable in materialized:
            stage_state.release(variable)
        collectives.barrier()


def prepare_to_load(whole_optimizer, whole_variables) -> None:
    """Give the whole optimizer storage for every variable, so that a file's state can be read into it."""
    if not whole_optimizer.built:
        whole_optimizer.build(whole_variables)
    for variable in whole_optimizer.variables:
        if stage_state.is_released(variable):
            stage_state.materialize(variable, np.zeros(tuple(variable.shape), variable.dtype))


def take_share(part_optimizer, whole_optimizer) -> None:
    """This rank's optimizer takes, by name, the state of its own variables from the loaded whole."""
    stage_state.assign_by_name(stage_state.optimizer_state_by_name(part_optimizer),
                               stage_state.optimizer_state_by_name(whole_optimizer))


def release(whole_optimizer) -> None:
    for variable in whole_optimizer.variables:
        if not stage_state.is_released(variable):
            stage_state.release(variable)


def share_from_master(part_optimizer, whole_optimizer, variables) -> None:
    """Collective: the master's loaded whole state reaches every rank's own optimizer, by name (relative to the
    model's `variables`, stage_state.optimizer_state_by_name); the master releases the whole after."""
    master = runtime.get_master_rank()
    whole = stage_state.optimizer_state_by_name(whole_optimizer, variables) if runtime.is_master_rank() else {}
    specs = collectives.broadcast_object({n: (tuple(v.shape), v.dtype) for n, v in whole.items()}, root=master)
    mine = stage_state.optimizer_state_by_name(part_optimizer, variables)
    for name in sorted(specs):
        shape, dtype = specs[name]
        buffer = (np.array(whole[name].numpy(), copy=True) if name in whole
                  else np.empty(shape, np.dtype(dtype)))
        value = collectives.broadcast(buffer, root=master)
        if name in mine:
            mine[name].assign(value)
    if whole:
        release(whole_optimizer)


def _sharded_attributes(model) -> dict:
    """{attribute name: optimizer} of `model`'s attributes holding an optimizer sharded by tnt.shard_optimizer."""
    return {name: value for name, value in vars(model).items()
            if isinstance(value, keras.optimizers.Optimizer) and getattr(value, "_tnt_shards", False)}


@contextlib.contextmanager
def _replaced(model, replacements: dict):
    """Within: every attribute of `model` holding an optimizer in `replacements` ({id: new}) holds the new one.
    Set past Keras's attribute tracking, as Keras's saving reads them (getattr)."""
    swapped = {name: value for name, value in _sharded_attributes(model).items() if id(value) in replacements}
    for name, value in swapped.items():
        object.__setattr__(model, name, replacements[id(value)])
    try:
        yield
    finally:
        for name, value in swapped.items():
            object.__setattr__(model, name, value)


def built_sharded_optimizers(model) -> list:
    """The sharded optimizers of `model` that are built, each once, in the order every rank finds them in
    (optimizers_of, which also shards them in that order)."""
    from tarantella.sharding.update import sharding_of
    return [o for o in optimizers_of(model) if sharding_of(o) is not None]


@contextlib.contextmanager
def own_optimizers_gathered_on_master(model):
    """Collective (Note [Saving a model with its own training logic, sharded]): within, the master's `model`
    holds, in place of each built sharded optimizer, a whole copy with every rank's state; yields whether this
    rank is the master, the one that writes."""
    from tarantella.sharding.update import sharding_of
    with contextlib.ExitStack() as stack:
        wholes = {}
        for optimizer in built_sharded_optimizers(model):
            update = sharding_of(optimizer)
            whole = unbuilt_copy(optimizer)
            if stack.enter_context(gathered_on_master(optimizer, update.owned, whole, update.variables)):
                wholes[id(optimizer)] = whole
        with _replaced(model, wholes):
            yield runtime.is_master_rank()


def read_own_whole(model, read) -> list:
    """Call `read` (a file's load into `model`) with each built sharded optimizer of `model` replaced by a whole
    copy with storage for all its variables (Note [Saving a model with its own training logic, sharded]); returns
    [(sharded optimizer, whole copy holding what was read)], for `take_share` or `share_from_master`. An optimizer
    not built yet stays: Keras skips its state with a warning, as for serial Keras's."""
    from tarantella.sharding.update import sharding_of
    pairs = []
    for optimizer in built_sharded_optimizers(model):
        pairs.append((optimizer, unbuilt_copy(optimizer)))
        prepare_to_load(pairs[-1][1], sharding_of(optimizer).variables)
    with _replaced(model, {id(optimizer): whole for optimizer, whole in pairs}):
        read()
    return pairs


def take_share_when_built(model) -> None:
    """For a loaded model with its own training logic about to be sharded (Note [Saving a model with its own
    training logic, sharded]): each optimizer attribute built with a file's whole state is replaced by an unbuilt
    copy, which takes its own share of that state once it is built (sharding's build calls `pending_share`)."""
    copies = {}
    for name, value in list(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and value.built and not getattr(value, "_tnt_shards", False):
            if id(value) not in copies:
                copies[id(value)] = unbuilt_copy(value)
                copies[id(value)]._tnt_loaded_whole = value
            object.__setattr__(model, name, copies[id(value)])


def pending_share(optimizer) -> None:
    """Just built on this rank's share: take that share of the loaded whole state it replaced, if any."""
    whole = getattr(optimizer, "_tnt_loaded_whole", None)
    if whole is not None:
        take_share(optimizer, whole)
        optimizer._tnt_loaded_whole = None
