"""The time-to-accuracy benchmarks' `:::MLLOG` lines, written by MLCommons' mlperf_logging.mllog.

    logger = make_logger("mllog.log")             # stdout and the file
    logger.event(constants.SEED, 1); logger.start(constants.RUN_START); ...

`read_events` reads such lines back (for result files and tests); whether a log follows the
rules is for compliance.py to say.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

__all__ = ["PREFIX", "constants", "make_logger", "read_events"]

PREFIX = ":::MLLOG "
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_logger(path: str | None, stream=None, stack_offset: int = 1) -> MLLogger:
    """An MLLogger writing each line to `stream` (stdout) and appending it to `path`.
    stack_offset: call levels between the logging call site and the logger (for metadata file/lineno)."""
    logger = logging.getLogger(f"tnt_bench.mllog.{path or 'stdout'}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handlers = [logging.StreamHandler(stream or sys.stdout)]
    if path:
        handlers.append(logging.FileHandler(path, mode="a", encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    return MLLogger(logger=logger, default_stack_offset=stack_offset, root_dir=re.escape(_REPO))


def read_events(text: str) -> list[dict]:
    return [json.loads(line[len(PREFIX):]) for line in text.splitlines() if line.startswith(PREFIX)]
