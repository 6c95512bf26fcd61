"""Callbacks' own state in an elastic job's commits (Note [Elastic commits] in commit_store.py): what a
Keras callback keeps between epochs (History's logs, EarlyStopping's patience count and best value,
ReduceLROnPlateau's wait and cooldown, ModelCheckpoint's best and batch counts) goes on in the next generation
as it would have in the one that was lost.

Note [Committed callback state]
A callback's state is its attributes whose values are plain data (numbers, strings, lists and dicts of them:
JSON), taken at each commit from every callback of the fit that runs before the committing one, and set
again once every callback's on_train_begin has run (which resets them). Callbacks are matched by class and by
their place among the callbacks of that class: the master keeps output callbacks (ModelCheckpoint, CSVLogger)
the other ranks drop (rank_callbacks.py), so the lists differ by rank. Not plain data, and not committed: a
model's weights kept by a callback (EarlyStopping(restore_best_weights=True)'s best_weights), functions, open
files. The model, the fit's params and what Keras sets itself are left out. Keras's monitoring callbacks
choose their comparison function at their first epoch's end; one committed after that chooses it at restore.
A callback that keeps state of its own process (a generation-specific counter) keeps it outside its
attributes.
"""
from __future__ import annotations

import json

import numpy as np

__all__ = ["captured", "restore"]

# Set by Keras for every fit, or not the callback's own: never committed.
_NOT_STATE = frozenset({"model", "_model", "params", "validation_data", "_chief_worker_only", "_supports_tf_logs"})


def _plain(value):
    """The value as JSON-able data, or None when it is not plain data."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.loads(json.dumps(value, default=lambda item: item.item()
                                         if isinstance(item, np.generic) else _refuse(item)))
        except (TypeError, ValueError):
            return None
    return None


def _refuse(item):
    raise TypeError(type(item).__name__)


def _keys(callbacks) -> list[str]:
    """Each callback's key: its class and its place among the callbacks of that class."""
    seen: dict[str, int] = {}
    keys = []
    for callback in callbacks:
        name = type(callback).__name__
        keys.append(f"{name}#{seen.get(name, 0)}")
        seen[name] = seen.get(name, 0) + 1
    return keys


def captured(callbacks) -> dict[str, dict]:
    """{key: {attribute: plain value}} of the callbacks (Note [Committed callback state])."""
    state = {}
    for key, callback in zip(_keys(callbacks), callbacks):
        values = {}
        for name, value in vars(callback).items():
            if name in _NOT_STATE:
                continue
            plain = _plain(value)
            if plain is not None or value is None:
                values[name] = plain
        state[key] = values
    return state


def restore(callbacks, state: dict[str, dict]) -> None:
    """Sets the committed attributes again on the callbacks this rank has."""
    for key, callback in zip(_keys(callbacks), callbacks):
        values = state.get(key, {})
        for name, value in values.items():
            current = getattr(callback, name, None)
            if isinstance(current, tuple) and isinstance(value, list):
                value = tuple(value)
            setattr(callback, name, value)
        if values and "monitor_op" not in values and getattr(callback, "monitor_op", False) is None and \
                hasattr(callback, "_set_monitor_op"):
            # Keras's monitoring callbacks (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint) choose their
            # comparison, a function, at their first epoch's end, and turn min_delta's sign then: the commit
            # holds the turned one, so it is chosen here and min_delta set again.
            callback._set_monitor_op()
            if "min_delta" in values:
                callback.min_delta = values["min_delta"]
