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
import os
import signal
import socket
import threading
import time

import keras
import numpy as np

from tarantella import collectives, runtime, timeline
from tarantella.data import distributed_dataset, resume_position
from tarantella.elastic import COMMIT_EVERY_VARIABLE, RESIZE_EXIT_CODE, RESIZE_SIGNAL_NAME, commit_store
from tarantella.step.metric_reduction import metric_variables
from tarantella.step.rank_callbacks import state_variables

__all__ = ["Resume", "prepare"]

logger = logging.getLogger("tarantella")


class _ResizeRequest:
    """The launcher asks the ranks (RESIZE_SIGNAL_NAME) to leave at the end of a step, so that a generation of
    another size goes on (hosts added or removed); the ranks agree on the step (a tiny allreduce per step)."""

    def __init__(self):
        self.asked = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), self._ask)

    def _ask(self, _signum, _frame):
        self.asked = True

    def agreed(self) -> bool:
        return bool(collectives.allreduce(np.array([int(self.asked)], dtype=np.int32), op="max")[0])


_resize = None


def _resize_request() -> _ResizeRequest:
    global _resize
    if _resize is None:
        _resize = _ResizeRequest()
    return _resize


class _Writer:
    """Writes commits on a thread of its own while the next steps run: a commit is taken when its values are
    copied out of the variables, and one write waits for the one before (they land in order)."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, root: str, arrays: list, meta: dict) -> None:
        self.flush()
        self._thread = threading.Thread(target=self._write, args=(root, arrays, meta), daemon=True,
                                        name="tnt-elastic-commit")
        self._thread.start()

    def _write(self, root, arrays, meta):
        try:
            with timeline.span(timeline.names.ELASTIC_COMMIT, track="elastic", step=meta["global_step"],
                               written=True):
                commit_store.write(root, arrays, meta)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread at the next flush
            self._error = error

    def flush(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class Resume:
    """What fit starts from: the dataset (moved on), the first epoch, the batches of it to drop, and the
    callback that commits."""

    def __init__(self, dataset, initial_epoch: int, callback: keras.callbacks.Callback, done: int = 0):
        self.dataset, self.initial_epoch, self.callback, self.done = dataset, initial_epoch, callback, done

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
                 metric_state: list | None = None):
        super().__init__()
        self.root, self.fit_index, self.writes = root, fit_index, writes
        self.variables, self.metrics = variables, metrics   # the metrics' state is summed over the ranks
        # Iterators of the dataset made before this process's (restored) and by it (Note [Resuming the data
        # where it stood]).
        self.iterations, self.made_before = iterations, made_before
        self.metric_state = metric_state   # restored into the metrics when the first epoch begins
        self.every = _commit_every()
        self.writer = _Writer()
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
                                                   "world_size": runtime.get_size()})

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
        resize = _resize_request().agreed()
        if resize or self.global_step % self.every == 0:
            self._commit(self.epoch, batch + 1)
        if resize:
            if runtime.is_master_rank():
                print(f"tarantella: elastic: the job's hosts changed; every rank leaves after step "
                      f"{self.global_step}, committed, for a generation of the new size", flush=True)
            # Asked again while leaving, the process must not die of it: Python restores the signal's default
            # action (terminate) at exit for handlers it set, not for an ignored signal.
            signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), signal.SIG_IGN)
            self.writer.flush()
            raise SystemExit(RESIZE_EXIT_CODE)   # every rank at the same step: none waits for another

    def on_epoch_end(self, epoch, logs=None):
        self.dropped = 0
        self._commit(epoch + 1, 0)

    def on_train_end(self, logs=None):
        self.writer.flush()


def _commit_every() -> int:
    raw = os.environ.get(COMMIT_EVERY_VARIABLE, "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"tarantella --elastic: {COMMIT_EVERY_VARIABLE}={raw!r} is not a whole number of steps "
                         f">= 1; use --commit-every 1 (every step) or more")
    return int(raw)


def _agreed_commit(root: str, fit_index: int) -> tuple[dict, int] | None:
    """Collective: the newest commit of this fit call on any host, and the rank that reads it."""
    found = commit_store.newest(root)
    mine = None
    if found is not None and int(found[0]["fit"]) == fit_index:
        mine = (int(found[0]["global_step"]), found[0], found[1])
    offers = collectives.allgather_object(None if mine is None else mine[0])
    if all(offer is None for offer in offers):
        return None
    best = max(offer for offer in offers if offer is not None)
    reader = offers.index(best)
    meta = collectives.broadcast_object(mine[1] if runtime.get_rank() == reader else None, root=reader)
    return meta, reader


def prepare(model, dataset, initial_epoch: int, steps_per_epoch) -> Resume | None:
    """Collective, on every rank, after the model and its optimizer are built: None when the job is not
    elastic; else where fit starts, with the newest commit restored into the model."""
    root = commit_store.directory()
    if root is None:
        return None
    if steps_per_epoch is not None:
        raise ValueError("tarantella --elastic: fit(steps_per_epoch=...) is not supported yet (an epoch's "
                         "steps would restart with the resumed epoch); leave steps_per_epoch out, or run "
                         "without --elastic")
    if getattr(model, "is_sharded", False):
        raise ValueError("tarantella --elastic: a sharded model (shard=...) cannot be resumed yet: its state is "
                         "split over the ranks; run it without shard=, or without --elastic")
    fit_index = getattr(model, "_elastic_fit_calls", 0)
    model._elastic_fit_calls = fit_index + 1
    hosts = collectives.allgather_object(socket.gethostname())
    rank = runtime.get_rank()
    writes = hosts.index(hosts[rank]) == rank   # the lowest rank of each host writes its copy
    variables, metrics = state_variables(model), _metrics_built(model, dataset)

    agreed = _agreed_commit(root, fit_index)
    if agreed is None:
        callback = CommitEveryStep(root, fit_index, variables, metrics, writes, 0, 0,
                                   resume_position.IterationCount(dataset), 0)
        return Resume(dataset, initial_epoch, callback)
    meta, reader = agreed
    epoch, done = int(meta["epoch"]), int(meta["batches_done"])
    started = time.perf_counter()
    every = variables + metrics
    if int(meta["count"]) != len(every):
        raise ValueError(f"tarantella --elastic: the commit holds {meta['count']} arrays, the model has "
                         f"{len(every)} variables and metric states: the program builds another model than the "
                         f"one committed")
    arrays = commit_store.read_arrays(commit_store.newest(root)[1], len(every)) if rank == reader else None
    values = []
    with timeline.span(timeline.names.ELASTIC_RESTORE, track="elastic", step=int(meta["global_step"]),
                       world_size=int(meta["world_size"])):
        for i, variable in enumerate(every):
            mine = arrays[i] if arrays is not None else np.array(variable.numpy(), copy=True)
            values.append(collectives.broadcast(mine, root=reader))
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
    # The iterator the commit was reading is made again by Keras; an epoch's end commit read none.
    made = int(meta["iterators"]) - (1 if done else 0)
    resume_position.advance(dataset, made)
    callback = CommitEveryStep(root, fit_index, variables, metrics, writes, int(meta["global_step"]), done,
                               resume_position.IterationCount(dataset), made, metric_state)
    return Resume(dataset, epoch, callback, done)
