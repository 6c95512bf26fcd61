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
import socket
import time

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.data import distributed_dataset, resume_position
from tarantella.elastic import callback_state, commit_store, committing
from tarantella.timeline import session as timeline_session
from tarantella.step.metric_reduction import metric_variables
from tarantella.step.rank_callbacks import state_variables

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

    def __init__(self, root: str, fit_index: int, variables: list, metrics: list, writes: bool,
                 global_step: int, dropped: int, iterations: resume_position.IterationCount, made_before: int,
                 metric_state: list | None = None, callbacks_state: dict | None = None):
        super().__init__()
        self.tracked: list = []                  # the callbacks whose state is committed (Resume.attach)
        self.callbacks_state = callbacks_state   # restored into them once their on_train_begin ran
        self.root, self.fit_index, self.writes = root, fit_index, writes
        self.variables, self.metrics = variables, metrics   # the metrics' state is summed over the ranks
        # Iterators of the dataset made before this process's (restored) and by it (Note [Resuming the data
        # where it stood]).
        self.iterations, self.made_before = iterations, made_before
        self.metric_state = metric_state   # restored into the metrics when the first epoch begins
        self.every = committing.commit_every()
        self.writer = committing.Writer()
        self.global_step, self.dropped = global_step, dropped   # dropped: batches of the first epoch

    def _commit(self, epoch: int, batches_done: int) -> None:
        """Collective (the metrics' state, summed over the ranks: Note [Metric state rides with the
        gradients]); the lowest rank of each host writes."""
        summed = [collectives.allreduce(np.asarray(v.numpy())) for v in self.metrics]
        if self.writes:
            arrays = [variable.numpy() for variable in self.variables] + summed   # copies: the commit's values
            self.writer.submit(self.root, arrays, {"fit": self.fit_index, "global_step": self.global_step,
                                                   "epoch": epoch, "batches_done": batches_done,
                                                   "iterators": self.made_before + self.iterations.value,
                                                   "world_size": runtime.get_size(),
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
    if getattr(model, "is_sharded", False):
        raise ValueError("tarantella --elastic: a sharded model (shard=...) cannot be resumed yet: its state is "
                         "split over the ranks; run it without shard=, or without --elastic")
    fit_index = getattr(model, "_elastic_fit_calls", 0)
    model._elastic_fit_calls = fit_index + 1
    hosts = collectives.allgather_object(socket.gethostname())
    rank = runtime.get_rank()
    writes = committing.writes_for_host(hosts)
    variables, metrics = state_variables(model), _metrics_built(model, dataset)

    agreed = committing.agreed_commit(root, fit_index)
    if agreed is None:
        callback = CommitEveryStep(root, fit_index, variables, metrics, writes, 0, 0,
                                   resume_position.IterationCount(dataset), 0)
        return Resume(dataset, initial_epoch, callback)
    meta, reader = agreed
    epoch, done = int(meta["epoch"]), int(meta["batches_done"])
    started = time.perf_counter()
    values = committing.restored_values(root, meta, reader, variables + metrics)
    for variable, value in zip(variables, values):
        variable.assign(value)
    # The summed metric state is rank 0's; the others start from none. A commit at an epoch's end holds the
    # finished epoch's, which Keras would reset.
    metric_state = [value if rank == 0 else np.zeros_like(value) for value in values[len(variables):]] \
        if done else None
    if runtime.is_master_rank():
        print(f"tarantella: elastic: {runtime.get_size()} ranks go on from the commit of epoch {epoch + 1}, "
              f"batch {done} (step {meta['global_step']}, made by {meta['world_size']} ranks), read on rank "
              f"{reader} (host {hosts[reader]}) in {time.perf_counter() - started:.2f} s", flush=True)
    # The iterator the commit was reading is made again by Keras; an epoch's end commit read none, unless one
    # iterator serves the whole fit.
    made = int(meta["iterators"]) - (1 if done or forever else 0)
    resume_position.advance(dataset, made)
    if forever:   # this fit's batches before the resumed epoch; its own done ones are dropped by the train function
        dataset = dataset.skip(int(meta["global_step"]) * max(1, int(model.steps_per_execution)) - done)
    callback = CommitEveryStep(root, fit_index, variables, metrics, writes, int(meta["global_step"]), done,
                               resume_position.IterationCount(dataset), made, metric_state, meta.get("callbacks"))
    return Resume(dataset, epoch, callback, done)
