"""Start-up of a rank: the engine, the world group, and the rank queries.

`init()` is implicit on first use, so a script run with plain `python` (no
launcher) is a 1-rank job.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import traceback

from tarantella import config as _config
from tarantella import memory_budget, mpi_defaults
from tarantella.world_check import WorldSizeError, check_world_size

__all__ = ["init", "is_initialized", "get_rank", "get_size", "get_master_rank", "is_master_rank",
           "world_group", "shutdown", "settings"]

_MASTER_RANK = 0
_lock = threading.Lock()
_state: dict = {}

logger = logging.getLogger("tarantella")


def _engine():
    from tarantella import _engine as engine
    return engine


def init() -> None:
    """Start the communication engine (MPI) on this rank; later calls do nothing."""
    with _lock:
        if _state:
            return
        settings_ = _config.load_config()
        # Note [Open MPI's components that tarantella leaves out] in mpi_defaults.py
        os.environ.update(mpi_defaults.for_this_process(os.environ))
        engine = _engine()
        engine.start(fusion_threshold_bytes=settings_.fusion_threshold_bytes,
                     timeout_seconds=settings_.timeout_seconds,
                     stall_warning_seconds=settings_.stall_warning_seconds,
                     algorithm=settings_.allreduce_algorithm,
                     log_level=logging.getLevelName(settings_.log_level),
                     log_on_all_devices=settings_.log_on_all_devices)
        world = engine.GroupHandle.world()
        try:  # N copies of rank 0 would train N independent models (tarantella/world_check.py)
            check_world_size(world.size, os.environ)
        except WorldSizeError:
            engine.stop()
            raise
        _state.update(settings=settings_, world=world)
        atexit.register(shutdown)
        memory_budget.start(settings_.memory_budget_bytes, world.rank, engine.abort_job)
        if world.size > 1:
            _abort_job_on_uncaught_exception()
        _set_up_logging(settings_, world.rank)
        if settings_.timeline:  # after atexit(shutdown): the timeline's exit hook runs first, engine still up
            from tarantella import timeline
            timeline.start(settings_.timeline, world.rank, world.size)
        logger.info("tarantella started on %d rank(s): %s", world.size, _config.describe(settings_))


def _set_up_logging(settings_: _config.Config, rank: int) -> None:
    logger.setLevel(settings_.log_level)
    if rank != _MASTER_RANK and not settings_.log_on_all_devices:
        logger.setLevel(max(logging.WARNING, logger.level))
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[tarantella rank {rank}] %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _abort_job_on_uncaught_exception() -> None:
    """One failing rank ends the job: print the traceback, then MPI_Abort the world."""
    previous = sys.excepthook

    def abort_on_exception(kind, value, trace):
        rank = _state["world"].rank
        sys.stderr.write(f"[tarantella rank {rank} on {socket.gethostname()}] uncaught exception; "
                         "ending the job on all ranks:\n")
        sys.stderr.write("".join(traceback.format_exception(kind, value, trace)))
        sys.stderr.flush()
        if previous is not sys.__excepthook__:
            previous(kind, value, trace)
        from tarantella.timeline import session as timeline_session
        timeline_session.abandon()  # this rank's part of the timeline, before MPI_Abort ends the process
        _engine().abort_job(1)

    sys.excepthook = abort_on_exception
    _end_job_on_failing_exit()


def _end_job_on_failing_exit() -> None:
    """`sys.exit(3)` on one rank ends the job with code 3 (MPI_Abort at exit) instead of
    waiting in MPI_Finalize until every other rank has finished too. Python tells
    neither sys.excepthook nor atexit about SystemExit, so sys.exit notes the code
    (`raise SystemExit(3)` itself is not seen: that rank waits for the others)."""
    original = sys.exit

    def exit_noting_the_code(code=None):
        if code is not None and code != 0:
            _state["failing_exit"] = code if isinstance(code, int) else 1
        original(code)

    sys.exit = exit_noting_the_code


def is_initialized() -> bool:
    return bool(_state)


def world_group():
    init()
    return _state["world"]


def settings() -> _config.Config:
    """The effective configuration of this rank (from the environment, see tarantella.config)."""
    init()
    return _state["settings"]


def get_rank() -> int:
    """This rank's id in the world, 0..get_size()-1."""
    return world_group().rank


def get_size() -> int:
    """The number of ranks in the job."""
    return world_group().size


def get_master_rank() -> int:
    """The rank that writes checkpoints, logs and output by default."""
    return _MASTER_RANK


def is_master_rank() -> bool:
    return get_rank() == _MASTER_RANK


def shutdown() -> None:
    """Stop the engine (and MPI, if tarantella started it). Called at exit."""
    with _lock:
        if not _state:
            return
        failing_exit = _state.get("failing_exit")
        _state.clear()
        if failing_exit is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            _engine().abort_job(failing_exit)
        _engine().stop()
