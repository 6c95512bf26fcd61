"""Each rank keeps only its stage: the other stages' weights are released, and
the whole model's state (weights and optimizer slots) is gathered only to be
saved, and scattered (kept where owned) when loaded.

Note [Releasing a variable]
The user builds the whole model on every rank (as for serial Keras); once the
model is cut, a variable of another stage is put back into Keras's own
"uninitialized" state (`_value` None, `_initializer` set: the state Keras
gives variables created in a StatelessScope), which holds no storage: reading
it yields a transient tensor of zeros of its shape, and Keras tracking, names,
shapes and the model's config are untouched. `materialize` gives it storage
again (the master, while it writes the whole model to a file). These are the
two private attributes Keras's TensorFlow Variable uses for that state
(keras/src/backend/common/variables.py); `check_release_supported` fails
clearly if a Keras release changes them.
"""
from __future__ import annotations

import keras
import numpy as np

from tarantella import collectives, runtime

__all__ = ["release", "was_released", "materialize", "is_released", "held_bytes", "check_release_supported",
           "gather_to_root", "gather_optimizer_on_master",
           "optimizer_state_by_name", "assign_by_name"]


def check_release_supported(variable) -> None:
    if not (hasattr(variable, "_value") and hasattr(variable, "_initializer") and hasattr(variable, "_initialize")):
        raise RuntimeError(f"tarantella: this Keras release ({keras.__version__}) stores variables differently; "
                           "pipelined models cannot release other stages' weights (Note [Releasing a variable])")


def release(variable) -> None:
    """Drop the variable's storage (Note [Releasing a variable])."""
    check_release_supported(variable)
    variable._initializer = keras.initializers.Zeros()
    variable._value = None
    variable._tnt_released = True


def was_released(variable) -> bool:
    """Released by `release` (and not materialised since), as opposed to deferred (tarantella/deferred_build.py)."""
    return getattr(variable, "_tnt_released", False)


def is_released(variable) -> bool:
    return getattr(variable, "_value", 0) is None


def materialize(variable, value) -> None:
    """Give a released variable storage holding `value`."""
    if is_released(variable):
        variable._initialize(np.asarray(value, dtype=variable.dtype))
        variable._initializer = None
        variable._tnt_released = False
    else:
        variable.assign(value)


def held_bytes(variables) -> int:
    """Bytes of storage these variables hold on this rank."""
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables if not is_released(v)))


def gather_to_root(values_by_key: dict, keys: list, specs: dict, owner_rank: dict, root: int, rank: int) -> dict:
    """Collective: for each key (same list on every rank), `root` gets the value held by rank
    owner_rank[key]. specs[key] = (shape, dtype), known everywhere. Returns {key: array} on root."""
    gathered = {}
    for key in keys:
        shape, dtype = specs[key]
        owner = owner_rank[key]
        buffer = (np.ascontiguousarray(values_by_key[key], dtype=dtype) if rank == owner
                  else np.empty(shape, dtype))
        value = collectives.broadcast(buffer, root=owner) if owner != root else buffer
        if rank == root:
            gathered[key] = np.array(value, copy=True).reshape(shape)
    return gathered


def gather_optimizer_on_master(part_optimizer, part_variables, whole_optimizer, whole_variables) -> list:
    """Collective: the master's `whole_optimizer` (built on `whole_variables` if it is not) gets the state
    of every rank's `part_optimizer` (built on that rank's `part_variables`), matched by name; a name held
    by several ranks (the iteration count, a replica's copy) is taken from the lowest. Returns, on the
    master, the whole optimizer's variables (to release once written)."""
    if not part_optimizer.built:
        part_optimizer.build(part_variables)
    mine = optimizer_state_by_name(part_optimizer, whole_variables)
    infos = collectives.allgather_object({n: (tuple(v.shape), v.dtype) for n, v in mine.items()})
    owner, specs = {}, {}
    for r, info in enumerate(infos):
        for name, spec in info.items():
            owner.setdefault(name, r)
            specs.setdefault(name, spec)
    names = sorted(owner)
    master, rank = runtime.get_master_rank(), runtime.get_rank()
    gathered = gather_to_root({n: v.numpy() for n, v in mine.items() if owner[n] == rank}, names, specs, owner,
                              master, rank)
    if rank != master:
        return []
    if not whole_optimizer.built:
        whole_optimizer.build(whole_variables)
    state = optimizer_state_by_name(whole_optimizer, whole_variables)
    assign_by_name(state, gathered)
    return list(state.values())


def optimizer_state_by_name(optimizer, model_variables=None) -> dict:
    """{variable name: variable} of an optimizer's state (iteration count, learning rate, slots).
    Names (not paths, which start with the optimizer's own name) derive from the model variable's
    path, so they are the same for a stage's optimizer and the whole model's. With `model_variables`
    (every model variable the optimizers involved are built on, the same list on every rank) a slot's
    name starts with its variable's index there instead of its path: a model's automatic name (hence
    its variables' paths) differs between ranks that built different models before it."""
    prefixes = sorted(((v.path.replace("/", "_") + "_", f"#{i}_") for i, v in enumerate(model_variables or [])),
                      key=lambda pair: -len(pair[0]))   # the longest path first: "dense_1" before "dense"
    state, seen = {}, {}
    for v in optimizer.variables:
        name = next((index + v.name[len(path):] for path, index in prefixes if v.name.startswith(path)), v.name)
        count = seen[name] = seen.get(name, 0) + 1    # a wrapper's and its inner optimizer's iteration
        state[name if count == 1 else f"{name}#{count}"] = v
    return state


def assign_by_name(target: dict, source: dict) -> None:
    """Copy the values of `source` into the variables of `target` of the same name."""
    for name, variable in target.items():
        if name in source:
            materialize(variable, np.asarray(source[name]))
