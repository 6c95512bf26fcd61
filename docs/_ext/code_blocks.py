"""The Python code blocks of the manual's pages, for the tests that run them (tests/docs/)."""
from __future__ import annotations

import os
import re

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCE = re.compile(r"^```python\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[tuple[str, str]]:
    """[(where, source)] of every ```python block under docs/, where = "page.md:line"."""
    found = []
    for directory, _, files in sorted(os.walk(DOCS)):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(directory, name)
            text = open(path, encoding="utf-8").read()
            for match in _FENCE.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{os.path.relpath(path, DOCS)}:{line}", match.group(1)))
    return found
