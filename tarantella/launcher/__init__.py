"""The `tarantella` command: starts a program on several ranks over MPI.

The manual is the docstring of tarantella.launcher.cli (and `tarantella --help`).
"""
from .cli import main

__all__ = ["main"]
