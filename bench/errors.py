"""The one kind of error a user of tnt-bench can cause.

It is reported as one line, `tnt-bench: error: <message>`, with exit code 2; every
other exception is a bug of ours and keeps its traceback.
"""

__all__ = ["BenchUsageError", "USAGE_EXIT_CODE"]

USAGE_EXIT_CODE = 2


class BenchUsageError(ValueError):
    """Bad input: the message says what was expected and what to change."""
