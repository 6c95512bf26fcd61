"""A callback's committed state goes on in a new process as in the old one (Note [Committed callback state])."""
from __future__ import annotations

import json

import keras

from tarantella.elastic import callback_state


def _fresh(model):
    callbacks = [keras.callbacks.EarlyStopping(monitor="loss", patience=5, min_delta=1.0),
                 keras.callbacks.History(), keras.callbacks.EarlyStopping(monitor="loss", patience=9)]
    for callback in callbacks:
        callback.set_model(model)
        callback.on_train_begin()
    return callbacks


def test_a_restored_early_stopping_counts_on_where_it_stood():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    going_on = _fresh(model)
    for callback in going_on:
        callback.on_epoch_end(0, {"loss": 5.0})
    committed = json.loads(json.dumps(callback_state.captured(going_on)))   # as a commit's meta.json holds it
    assert "model" not in committed["EarlyStopping#0"] and committed["History#0"]["history"] == {"loss": [5.0]}
    restored = _fresh(model)   # on_train_begin reset them
    callback_state.restore(restored, committed)
    for callbacks in (going_on, restored):
        for callback in callbacks:
            callback.on_epoch_end(1, {"loss": 4.5})   # better, but by less than min_delta
    for mine, theirs in zip(restored, going_on):
        assert callback_state.captured([mine]) == callback_state.captured([theirs])
    assert restored[0].wait == 1 and restored[0].best == 5.0 and restored[2].best == 4.5
    assert restored[1].history == {"loss": [5.0, 4.5]}
