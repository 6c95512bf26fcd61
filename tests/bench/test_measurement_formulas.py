"""The formulas the measuring tools report (bench/serial_fraction.py, bench/input/shared_cores.py)."""
import pytest

from bench.input.shared_cores import between_max_and_sum
from bench.serial_fraction import efficiency, serial_fraction

pytestmark = pytest.mark.timeout(30)


def test_amdahls_serial_fraction_from_one_core_and_two():
    assert serial_fraction(10.0, 5.0) == 0.0                    # twice as fast: nothing serial
    assert serial_fraction(10.0, 10.0) == 1.0                   # no faster: all of it
    assert serial_fraction(22.52, 12.74) == pytest.approx(2 * 12.74 / 22.52 - 1)    # 1.77x: 0.131
    assert serial_fraction(10.0, 4.0) == 0.0                    # faster than two cores allow: clipped
    assert efficiency(0.0, 48) == pytest.approx(1.0)
    assert efficiency(0.1216, 12) == pytest.approx(1 / (12 * 0.1216 + 0.8784))


def test_a_step_between_max_and_sum_of_model_and_input():
    assert between_max_and_sum(2.0, 1.0, 2.0) == 0.0            # the input hidden
    assert between_max_and_sum(2.0, 1.0, 3.0) == 1.0            # added
    assert between_max_and_sum(2.0, 2.0, 3.0) == pytest.approx(0.5)
    assert between_max_and_sum(2.0, 0.0, 2.5) == 0.0            # no input: nothing to place
