"""Device counts of a sweep, from `--devices`.

    "1..96"      powers of two from 1 up to 96, plus both endpoints: 1 2 4 8 16 32 64 96
    "3..12"      3 4 8 12
    "1,2,6,12"   exactly these (sorted, duplicates dropped)
    "8"          just 8
"""
from __future__ import annotations

import re

from bench.errors import BenchUsageError

__all__ = ["parse_device_counts"]

_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")
_EXPECTED = "expected a range such as 1..96, a list such as 1,2,6,12, or one count such as 8"


def _positive(text: str, spec: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise BenchUsageError(f"--devices {spec!r}: {text!r} is not a whole number; {_EXPECTED}")
    value = int(text)
    if value < 1:
        raise BenchUsageError(f"--devices {spec!r}: device counts start at 1, got {value}")
    return value


def parse_device_counts(spec: str) -> list[int]:
    """The sorted device counts that `spec` names; BenchUsageError if it names none."""
    match = _RANGE.match(spec)
    if match:
        low, high = (_positive(group, spec) for group in match.groups())
        if low > high:
            raise BenchUsageError(
                f"--devices {spec!r}: the range runs backwards; write {high}..{low}")
        counts = {low, high}
        power = 1
        while power <= high:
            if power >= low:
                counts.add(power)
            power *= 2
        return sorted(counts)
    if not spec.strip():
        raise BenchUsageError(f"--devices is empty; {_EXPECTED}")
    if ".." in spec:
        raise BenchUsageError(f"--devices {spec!r}: {_EXPECTED}")
    return sorted({_positive(part, spec) for part in spec.split(",")})
