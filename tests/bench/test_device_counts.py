import pytest

from bench.errors import BenchUsageError
from bench.sweep.device_counts import parse_device_counts


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec, expected", [
    ("1..96", [1, 2, 4, 8, 16, 32, 64, 96]),
    ("1..2", [1, 2]),
    ("3..12", [3, 4, 8, 12]),
    ("1,2,6,12", [1, 2, 6, 12]),
    ("12,6,6,1", [1, 6, 12]),
    ("8", [8]),
    (" 2 .. 4 ", [2, 4]),
])
def test_counts(spec, expected):
    assert parse_device_counts(spec) == expected


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec, says", [
    ("0..4", "start at 1"),
    ("4..1", "runs backwards"),
    ("abc", "not a whole number"),
    ("", "empty"),
    ("1,,2", "not a whole number"),
    ("1..2..3", "expected a range"),
    ("-1", "not a whole number"),
])
def test_bad_counts(spec, says):
    with pytest.raises(BenchUsageError, match=says):
        parse_device_counts(spec)
