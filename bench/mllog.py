"""MLPerf's `:::MLLOG` log lines, as mlperf-logging writes them, so its checkers can read ours.

    :::MLLOG {"namespace": "", "time_ms": 1700000000000, "event_type": "POINT_IN_TIME",
              "key": "eval_accuracy", "value": 0.93, "metadata": {"file": "...", "lineno": 0, "epoch_num": 3}}

event_type is INTERVAL_START / INTERVAL_END for *_start / *_stop keys, else POINT_IN_TIME.
"""
from __future__ import annotations

import json
import sys
import time

__all__ = ["MLLogger", "parse_mllog"]

PREFIX = ":::MLLOG "


class MLLogger:
    def __init__(self, stream=None, path: str | None = None, file_name: str = "train_benchmark"):
        self.stream = stream or sys.stdout
        self.path = path
        self.file_name = file_name

    def log(self, key: str, value=None, **metadata) -> dict:
        if key.endswith("_start"):
            event = "INTERVAL_START"
        elif key.endswith("_stop"):
            event = "INTERVAL_END"
        else:
            event = "POINT_IN_TIME"
        record = {"namespace": "", "time_ms": int(time.time() * 1000), "event_type": event,
                  "key": key, "value": value,
                  "metadata": {"file": self.file_name, "lineno": 0, **metadata}}
        line = PREFIX + json.dumps(record)
        self.stream.write(line + "\n")
        self.stream.flush()
        if self.path:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return record


def parse_mllog(text: str) -> list[dict]:
    return [json.loads(line[len(PREFIX):]) for line in text.splitlines() if line.startswith(PREFIX)]
