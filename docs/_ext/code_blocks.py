"""The Python code blocks of the manual's pages, for the tests that run them (tests/docs/)."""
from __future__ import annotations

import os
import re

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks(language: str) -> list[tuple[str, str]]:
    """[(where, source)] of every ```language block under docs/, where = "page.md:line" of its first line."""
    fence = re.compile(rf"^```{language}\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
    found = []
    for directory, _, files in sorted(os.walk(DOCS)):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(directory, name)
            text = open(path, encoding="utf-8").read()
            for match in fence.finditer(text):
                line = text.count("\n", 0, match.start()) + 2
                found.append((f"{os.path.relpath(path, DOCS)}:{line}", match.group(1)))
    return found


def python_blocks() -> list[tuple[str, str]]:
    return _blocks("python")


def command_lines() -> list[tuple[str, str]]:
    """[(where, line)] of every line of the ```bash blocks, where = "page.md:line"."""
    found = []
    for where, source in _blocks("bash"):
        page, first = where.rsplit(":", 1)
        found += [(f"{page}:{int(first) + i}", line) for i, line in enumerate(source.splitlines()) if line.strip()]
    return found
