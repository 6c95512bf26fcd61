"""The `RESULT {json}` lines the cluster test programs print, one per rank."""
from __future__ import annotations

import json

__all__ = ["rank_results"]

_MARK = "RESULT "


def rank_results(text: str) -> dict[int, dict]:
    """{rank: values} from every line carrying `RESULT {json}` (tagged "[r] " or not)."""
    found = {}
    for line in text.splitlines():
        if _MARK in line:
            values = json.loads(line[line.index(_MARK) + len(_MARK):])
            found[values["rank"]] = values
    return found
