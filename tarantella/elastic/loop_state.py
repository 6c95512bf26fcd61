"""A custom training loop's commits in an elastic job (tarantella --elastic): tnt.elastic.State.

    state = tnt.elastic.State(model=model, optimizer=optimizer, epoch=0, batch=0)
    state.restore()                      # a later generation: the newest commit; else nothing
    for epoch in range(EPOCHS):
        for batch, data in enumerate(dataset):          # one iterator per epoch, as before the loss
            if (epoch, batch) < (state.epoch, state.batch):
                continue                                # done before the commit: read and dropped
            train_step(data)
            state.epoch, state.batch = (epoch, batch + 1)
            state.commit()

As Horovod Elastic's State: the variables of a model and an optimizer (and any others given), and plain
values the loop keeps (JSON: numbers, strings, lists), committed together (Note [Elastic commits] in
commit_store.py). commit() is a collective at a step boundary; when the launcher asks for a resize (the job's
hosts changed), every rank leaves there, committed. restore() is a collective once the model and optimizer
are built; after it restored a commit, the callbacks given to register_reset_callbacks run (the world size
may differ from the commit's: tnt.get_size()). Outside an elastic job both do nothing.
"""
from __future__ import annotations

import os

from tarantella import runtime
from tarantella.elastic import commit_store, committing
from tarantella.timeline import session as timeline_session

__all__ = ["State"]

_ROOT = "custom-loop"   # beside fit's commits, never mixed with them


class State:
    def __init__(self, model=None, optimizer=None, variables=(), **values):
        self._model, self._optimizer, self._extra = model, optimizer, list(variables)
        self._values = dict(values)
        self._commits = 0
        self._reset_callbacks = []
        self._writer = committing.Writer()
        self._state = None
        root = commit_store.directory()
        self._root = os.path.join(root, _ROOT) if root else None

    def __getattr__(self, name):
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"tnt.elastic.State has no value {name!r}; give it to State(..., {name}=...)")

    def __setattr__(self, name, value):
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self._values[name] = value

    def register_reset_callbacks(self, callbacks) -> None:
        self._reset_callbacks.extend(callbacks)

    def _named(self) -> committing.NamedState:
        """Collective the first time, once the model and optimizer are built: their variables by name, those with
        storage on this rank (Note [A commit by name]; a sharded optimizer's slots by their variables)."""
        if self._state is None:
            optimizers = {"o": self._optimizer} if self._optimizer is not None else {}
            self._state = committing.NamedState(committing.held_by_name(list(getattr(self._model, "variables", [])),
                                                                        optimizers, self._extra))
        return self._state

    def commit(self) -> None:
        """Collective, at a step boundary: this state becomes what a new generation starts from."""
        if self._root is None:
            return
        self._commits += 1
        self._named().submit(self._writer, self._root, [], {"fit": 0, "global_step": self._commits, "epoch": 0,
                                                            "batches_done": 0, "values": self._values})
        timeline_session.spool()
        if committing.resize_request().agreed():
            committing.leave_for_resize(self._writer, self._commits)

    def restore(self) -> bool:
        """Collective: sets the variables and values to the newest commit's; False when there is none."""
        if self._root is None:
            return False
        restored = self._named().restore(self._root, 0)
        if restored is None:
            return False
        meta, values = restored
        self._named().assign(values)
        self._values = dict(meta["values"])
        self._commits = int(meta["global_step"])
        if runtime.is_master_rank():
            print(f"tarantella: elastic: {runtime.get_size()} ranks go on from commit {self._commits} of the loop "
                  f"(made by {meta['world_size']} ranks): {self._values}", flush=True)
        for callback in self._reset_callbacks:
            callback()
        return True

    def flush(self) -> None:
        """Waits for the last commit to be written (at the end of training)."""
        self._writer.flush()
