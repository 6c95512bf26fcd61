"""tnt.Model.fit in an elastic job: a commit after every step (--commit-every N: every N-th) and at every
epoch's end, the newest commit restored when fit starts.

What a commit holds and where it goes: Note [Elastic commits] (commit_store.py). Here: which variables, the
data's position, and how a new generation of ranks agrees on the commit to restore:
  - every rank says which commit its host holds (the newest of this fit call), and the lowest rank of a host
    with the newest of all reads it and gives every rank its values (ranks of a host that joined later, or
    that lost the last commit in the middle of writing it, get them too);
  - the epoch and the batches done in it set where Keras's fit and the rank's data start (Note [Resuming the
    data where it stood] in tarantella/data/resume_position.py).
"""
from __future__ import annotations

import logging

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.data import distributed_dataset, resume_position
from tarantella.elastic import callback_state, commit_store, committing
from tarantella.timeline import session as timeline_session
from tarantella.step.metric_reduction import metric_variables

__all__ = ["Resume", "prepare"]

logger = logging.getLogger("tarantella")


class Resume:
    """What fit starts from: the dataset (moved on), the first epoch, the batches of it to drop, and the
    callback that commits."""

    def __init__(self, dataset, initial_epoch: int, callback: keras.callbacks.Callback, done: int = 0):
        self.dataset, self.initial_epoch, self.callback, self.done = dataset, initial_epoch, callback, done

    def attach(self, callbacks: list) -> list:
        """The fit's callbacks, the committing one after those whose state it commits (Note [Committed callback
        state]), and after a History of the fit's own: the one Keras adds would come after it, too late to
        commit an epoch's logs."""
        if not any(isinstance(callback, keras.callbacks.History) for callback in callbacks):
            callbacks = callbacks + [keras.callbacks.History()]
        self.callback.tracked = [callback for callback in callbacks
                                 if not type(callback).__module__.startswith("tarantella.")]
        return callbacks + [self.callback]

    def install(self, model) -> None:
        """Wraps the model's train function: its first `done` calls read their batches and drop them."""
        if not self.done:
            return
        model.make_train_function()
        train = model.train_function
        remaining = [self.done // max(1, model.steps_per_execution)]

        def drop_or_train(iterator):
            if remaining[0] <= 0:
                return train(iterator)
            remaining[0] -= 1
            for _ in range(max(1, model.steps_per_execution)):
                next(iterator)
            return model.get_metrics_result()   # the committed logs

        model.train_function = drop_or_train


def _metrics_built(model, dataset) -> list:
    """The compiled metrics' variables, built first if no step has built them (Keras builds them in the first
    step, after a restore would have had to set them)."""
    if any(not getattr(metric, "built", True) for metric in model.metrics) and getattr(model, "compiled", False):
        try:
            model._symbolic_build(data_batch=dataset.element_spec[distributed_dataset.DATA])
        except Exception as error:  # noqa: BLE001 - a model Keras cannot build symbolically
            logger.debug("elastic: metrics not built before the first step (%s); their state is not restored",
                         error)
    return metric_variables(model.metrics)


class CommitEveryStep(keras.callbacks.Callback):
    """Commits after every N-th training step and at every epoch's end (Note [Elastic commits]); at the end of a
    step the ranks agreed to leave at (a resize), too."""

    def __init__(self, root: str, fit_index: int, state: committing.NamedState, metrics: list, global_step: int,
                 dropped: int, iterations: resume_position.IterationCount, made_before: int,
                 metric_state: list | None = None, callbacks_state: dict | None = None):
        super().__init__()
        self.tracked: list = []                  # the callbacks whose state is committed (Resume.attach)
        self.callbacks_state = callbacks_state   # restored into them once their on_train_begin ran
        self.root, self.fit_index, self.state = root, fit_index, state
        self.metrics = metrics   # the metrics' state is summed over the ranks
        # Iterators of the dataset made before this process's (restored) and by it (Note [Resuming the data
        # where it stood]).
        self.iterations, self.made_before = iterations, made_before
        self.metric_state = metric_state   # restored into the metrics when the first epoch begins
        self.every = committing.commit_every()
        self.writer = committing.Writer()
        self.global_step, self.dropped = global_step, dropped   # dropped: batches of the first epoch

    def _commit(self, epoch: int, batches_done: int) -> None:
        """Collective (the metrics' state, summed over the ranks: Note [Metric state rides with the
        gradients]); each rank writes the names it writes for its host (Note [A commit by name])."""
        summed = [collectives.allreduce(np.asarray(v.numpy())) for v in self.metrics]
        self.state.submit(self.writer, self.root, summed,
                          {"fit": self.fit_index, "global_step": self.global_step, "epoch": epoch,
                           "batches_done": batches_done, "iterators": self.made_before + self.iterations.value,
                           "callbacks": callback_state.captured(self.tracked)})
        timeline_session.spool()

    def on_train_begin(self, logs=None):
        if self.callbacks_state:
            callback_state.restore(self.tracked, self.callbacks_state)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.metric_state is not None:   # after Keras reset the metrics for the epoch
            for variable, value in zip(self.metrics, self.metric_state):
                variable.assign(value)
            self.metric_state = None

    def on_train_batch_end(self, batch, logs=None):
        if batch < self.dropped:   # read and dropped: the commit holds it already
            return
        self.global_step += 1
        resize = committing.resize_request().agreed()
        if resize or self.global_step % self.every == 0:
            self._commit(self.epoch, batch + 1)
        if resize:
            committing.leave_for_resize(self.writer, self.global_step)

    def on_epoch_end(self, epoch, logs=None):
        self.dropped = 0
        self._commit(epoch + 1, 0)

    def on_train_end(self, logs=None):
        self.writer.flush()


def prepare(model, dataset, initial_epoch: int, steps_per_epoch) -> Resume | None:
    """Collective, on every rank, after the model and its optimizer are built: None when the job is not
    elastic; else where fit starts, with the newest commit restored into the model."""
    root = commit_store.directory()
    if root is None:
        return None
    # With steps_per_epoch, Keras reads one iterator through the whole fit (an epoch ends after its steps,
    # not with the data): resumed by skipping the earlier epochs' batches (Note [Resuming the data where it
    # stood]). A dataset of finite length would also be made again when it runs out, mid-epoch.
    forever = steps_per_epoch is not None
    if forever and int(dataset.cardinality()) != int(tf.data.INFINITE_CARDINALITY):
        raise ValueError("tarantella --elastic: fit(steps_per_epoch=...) is supported for a dataset that repeats "
                         "forever (dataset.repeat()), which Keras reads through the whole fit; repeat the dataset, "
                         "leave steps_per_epoch out, or run without --elastic")
    fit_index = getattr(model, "_elastic_fit_calls", 0)
    model._elastic_fit_calls = fit_index + 1
    metrics = _metrics_built(model, dataset)
    summed = [f"m{i}" for i in range(len(metrics))]
    state = committing.NamedState(_held_by_name(model), summed)

    restored = state.restore(root, fit_index)
    if restored is None:
        callback = CommitEveryStep(root, fit_index, state, metrics, 0, 0, resume_position.IterationCount(dataset), 0)
        return Resume(dataset, initial_epoch, callback)
    meta, values = restored
    epoch, done = int(meta["epoch"]), int(meta["batches_done"])
    state.assign(values)
    # The summed metric state is rank 0's; the others start from none. A commit at an epoch's end holds the
    # finished epoch's, which Keras would reset.
    metric_state = [values[name] if runtime.get_rank() == 0 else np.zeros_like(values[name]) for name in summed] \
        if done else None
    if runtime.is_master_rank():
        readers = sorted({state.hosts[r] for r in meta["readers"]})
        print(f"tarantella: elastic: {runtime.get_size()} ranks go on from the commit of epoch {epoch + 1}, "
              f"batch {done} (step {meta['global_step']}, made by {meta['world_size']} ranks), read on "
              f"{'host' if len(readers) == 1 else 'hosts'} {', '.join(readers)} in {meta['seconds']:.2f} s",
              flush=True)
    # The iterator the commit was reading is made again by Keras; an epoch's end commit read none, unless one
    # iterator serves the whole fit.
    made = int(meta["iterators"]) - (1 if done or forever else 0)
    resume_position.advance(dataset, made)
    if forever:   # this fit's batches before the resumed epoch; its own done ones are dropped by the train function
        dataset = dataset.skip(int(meta["global_step"]) * max(1, int(model.steps_per_execution)) - done)
    callback = CommitEveryStep(root, fit_index, state, metrics, int(meta["global_step"]), done,
                               resume_position.IterationCount(dataset), made, metric_state, meta.get("callbacks"))
    return Resume(dataset, epoch, callback, done)


def _held_by_name(model) -> dict:
    """{name: variable} of the state this rank holds (Note [A commit by name]): the wrapped model's variables and
    the optimizers' state, those with storage here (a sharded rank's own share)."""
    wrapped = getattr(model, "wrapped_model", model)
    return committing.held_by_name(wrapped.variables, {f"o:{attribute}": optimizer for attribute, optimizer
                                                       in _optimizers_by_attribute(model, wrapped).items()})


def _optimizers_by_attribute(model, wrapped) -> dict:
    """The optimizers that train, by the attribute that holds them: tnt.Model's own first, then the wrapped
    model's (a GAN's d_optimizer, g_optimizer), each once. So the names do not depend on the rank count: a sharded
    tnt.Model compiles the wrapped model with a stateless copy of its optimizer (Note [A sharded update]), which
    its `optimizer` attribute then holds; it is not the one that trains, and is left out."""
    found: dict = {}
    for owner in (model, wrapped):
        for attribute, value in [("optimizer", getattr(owner, "optimizer", None))] + list(vars(owner).items()):
            if isinstance(value, keras.optimizers.Optimizer) and attribute not in found \
                    and all(value is not other for other in found.values()):
                found[attribute] = value
    return found
