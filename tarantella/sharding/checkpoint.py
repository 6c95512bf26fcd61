"""Saving and restoring a model whose optimizer state is sharded (shard="optimizer").

Note [Saving and restoring sharded optimizer state]
A sharded tnt.Model compiles the wrapped (user's) model with a copy of the
optimizer that holds no state (Note [A sharded update] in update.py); it is
what a `.keras` or `.weights.h5` file of the wrapped model writes. Saving is
a collective: every rank's owned state is gathered by name into the master's
copy (built on all variables there, for the time of the write), the master
writes one ordinary file, plain Keras can load it, and the copy's storage is
released again. Restoring reads the whole state into the copy, and each rank
keeps the state of the variables it owns (names derive from the variables'
paths, so they match across ranks and rank counts: a file written at one rank
count resumes at another). A rank that reads the file itself takes its share
and releases the rest; where only the master reads it (BackupAndRestore, whose
backup lives on the master's file system) the master sends every rank the
state by name (`share_from_master`), one variable at a time.
"""
from __future__ import annotations

import contextlib

import numpy as np

from tarantella import collectives, runtime
from tarantella.pipeline import stage_state

__all__ = ["gathered_on_master", "prepare_to_load", "take_share", "release", "share_from_master"]


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


def share_from_master(part_optimizer, whole_optimizer) -> None:
    """Collective: the master's loaded whole state reaches every rank's own optimizer, by name; the master
    releases the whole after."""
    master = runtime.get_master_rank()
    whole = stage_state.optimizer_state_by_name(whole_optimizer) if runtime.is_master_rank() else {}
    specs = collectives.broadcast_object({n: (tuple(v.shape), v.dtype) for n, v in whole.items()}, root=master)
    mine = stage_state.optimizer_state_by_name(part_optimizer)
    for name in sorted(specs):
        shape, dtype = specs[name]
        buffer = (np.array(whole[name].numpy(), copy=True) if name in whole
                  else np.empty(shape, np.dtype(dtype)))
        value = collectives.broadcast(buffer, root=master)
        if name in mine:
            mine[name].assign(value)
    if whole:
        release(whole_optimizer)
