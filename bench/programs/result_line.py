"""How a rank program hands its result to the sweep runner: one tagged JSON line on stdout.

The launcher passes the master rank's stdout through unchanged; the runner takes
the last line that starts with the tag.
"""
from __future__ import annotations

import json

__all__ = ["RESULT_TAG", "PROGRESS_TAG", "format_result_line", "parse_result_line"]

RESULT_TAG = "TNT_BENCH_RESULT "
PROGRESS_TAG = "TNT_BENCH_PROGRESS "   # one line per step while the program measures (StepTimer)


def format_result_line(result: dict) -> str:
    return RESULT_TAG + json.dumps(result, sort_keys=True)


def parse_result_line(stdout: str) -> dict | None:
    found = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            found = json.loads(line[len(RESULT_TAG):])
    return found
