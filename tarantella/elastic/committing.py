"""What the ranks of an elastic job do together to commit and restore (Note [Elastic commits] in
commit_store.py): who writes each host's copy, which commit a new generation restores and who reads it, the
writing thread, and leaving at a step's end when the launcher asks for a resize. Used by tnt.Model.fit
(fit_commits.py) and custom loops (loop_state.py).
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time

import numpy as np

from tarantella import collectives, runtime, timeline
from tarantella.elastic import (COMMIT_EVERY_VARIABLE, GENERATION_VARIABLE, RESIZE_EXIT_CODE, RESIZE_SIGNAL_NAME,
                                commit_store)
from tarantella.timeline import session as timeline_session

__all__ = ["ResizeRequest", "resize_request", "leave_for_resize", "Writer", "commit_every", "agreed_commit",
           "restored_values", "writes_for_host"]


class ResizeRequest:
    """The launcher asks the ranks (RESIZE_SIGNAL_NAME) to leave at the end of a step, so that a generation of
    another size goes on (hosts added or removed); the ranks agree on the step (a tiny allreduce per step)."""

    def __init__(self):
        self.asked = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), self._ask)
            # At exit Python puts back the default action (terminate) of a signal it handles, not of an ignored
            # one: a request that comes as the program ends (its fit done) must not kill it, or the launcher
            # would take the rank for lost.
            atexit.register(signal.signal, getattr(signal, RESIZE_SIGNAL_NAME), signal.SIG_IGN)

    def _ask(self, _signum, _frame):
        self.asked = True

    def agreed(self) -> bool:
        return bool(collectives.allreduce(np.array([int(self.asked)], dtype=np.int32), op="max")[0])


_resize = None


def resize_request() -> ResizeRequest:
    global _resize
    if _resize is None:
        _resize = ResizeRequest()
    return _resize


class Writer:
    """Writes commits on a thread of its own while the next steps run: a commit is taken when its values are
    copied out of the variables, and one write waits for the one before (they land in order)."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, root: str, arrays: list, meta: dict) -> None:
        self.flush()
        meta = {**meta, "taken_at": time.time()}   # the timeline's resize starts there
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


def commit_every() -> int:
    raw = os.environ.get(COMMIT_EVERY_VARIABLE, "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"tarantella --elastic: {COMMIT_EVERY_VARIABLE}={raw!r} is not a whole number of steps "
                         f">= 1; use --commit-every 1 (every step) or more")
    return int(raw)


def _generation() -> int:
    """Which generation of the elastic job this process belongs to (the launcher sets it)."""
    return int(os.environ.get(GENERATION_VARIABLE, "1") or "1")


def agreed_commit(root: str, fit_index: int) -> tuple[dict, int] | None:
    """Collective: the newest commit of this fit call on any host, and the rank that reads it. Called as a
    generation starts, which the timeline files then name (Note [Timeline files])."""
    timeline_session.join_generation(_generation())
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


def writes_for_host(hosts: list[str]) -> bool:
    """Whether this rank writes its host's copy: the lowest rank of each host does (`hosts`: every rank's)."""
    rank = runtime.get_rank()
    return hosts.index(hosts[rank]) == rank


def restored_values(root: str, meta: dict, reader: int, variables: list) -> list[np.ndarray]:
    """Collective: the commit's values of `variables`, read on rank `reader` and given to every rank."""
    if int(meta["count"]) != len(variables):
        raise ValueError(f"tarantella --elastic: the commit holds {meta['count']} arrays, this program has "
                         f"{len(variables)} variables (and metric states) to restore: it builds another model or "
                         f"optimizer than the one committed")
    arrays = commit_store.read_arrays(commit_store.newest(root)[1], len(variables)) \
        if runtime.get_rank() == reader else None
    values = []
    with timeline.span(timeline.names.ELASTIC_RESTORE, track="elastic", step=int(meta["global_step"]),
                       world_size=int(meta["world_size"])):
        for i, variable in enumerate(variables):
            mine = arrays[i] if arrays is not None else np.array(variable.numpy(), copy=True)
            values.append(collectives.broadcast(mine, root=reader))
    if "taken_at" in meta:   # from the commit taken to the new generation holding it: steps lost and restart
        now = time.monotonic()
        timeline.complete(timeline.names.ELASTIC_RESIZE, now - max(0.0, time.time() - float(meta["taken_at"])), now,
                          track="elastic", step=int(meta["global_step"]), world_size_before=int(meta["world_size"]),
                          world_size=runtime.get_size(), generation=_generation())
    return values


def leave_for_resize(writer: Writer, step: int) -> None:
    """Every rank at the same step (ResizeRequest.agreed): none waits for another in MPI_Finalize."""
    if runtime.is_master_rank():
        print(f"tarantella: elastic: the job's hosts changed; every rank leaves after step {step}, committed, "
              f"for a generation of the new size", flush=True)
    # Asked again while leaving, the process must not die of it: Python restores the signal's default action
    # (terminate) at exit for handlers it set, not for an ignored signal.
    signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), signal.SIG_IGN)
    timeline_session.leave_generation()
    writer.flush()
    raise SystemExit(RESIZE_EXIT_CODE)
