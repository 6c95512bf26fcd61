"""The tolerance's cap (Note [Tolerance cap]): a drifting calibration is reported, never a wide tolerance, and
beyond the cap only the band up to the uncapped tolerance is UNDECIDED (Note [Undecided])."""
import numpy as np
import pytest

from repro import compare, tolerance, verdicts

pytestmark = pytest.mark.timeout(10)


def _calibration(per_step: list[float]) -> compare.Differences:
    """Serial vs calibration differences of one variable, as compare.differences returns them."""
    steps = len(per_step) - 1
    weights = np.array(per_step, dtype=np.float64).reshape(-1, 1)
    return compare.Differences(steps, (steps, steps), ["000:model/dense/kernel"],
                               [[value == 0.0] for value in per_step], weights, weights * 0.5,
                               np.array([np.nan] + [0.0] * steps), sized=True)


def test_a_drifting_calibration_is_reported_and_the_tolerance_stays_capped():
    drifting = [0.0] + [1e-7 * 4.0 ** step for step in range(1, 12)]     # 4e-7 ... 0.42: exponential drift
    derived = tolerance.derive(_calibration(drifting))
    crossing = next(step for step, value in enumerate(drifting) if tolerance.SPREAD * value > tolerance.CAP)
    assert derived.exceeded_cap_at == crossing
    assert derived.weights.max() == tolerance.CAP and derived.uncapped_maximum > 1000 * tolerance.CAP
    assert derived.how.startswith("calibration exceeds the cap") and f"step {crossing}" in derived.how
    assert "UNDECIDED" in derived.how and verdicts.UNDECIDED not in verdicts.PASSING
    for step in range(len(drifting)):   # EQUIVALENT up to the cap, UNDECIDED up to 16 x the calibration
        assert derived.at(step) <= tolerance.CAP
        assert derived.undecided_up_to(step) == pytest.approx(max(derived.at(step), tolerance.SPREAD * max(
            max(drifting[:step + 1]), step * tolerance.UNIT_ROUNDOFF)))
    assert derived.as_dict()["cap"] == tolerance.CAP and derived.as_dict()["exceeded_cap_at"] == crossing


def test_a_steady_calibration_gives_the_measured_tolerance():
    steady = [0.0, 1e-7, 2e-7, 2e-7, 3e-7]
    derived = tolerance.derive(_calibration(steady))
    assert derived.exceeded_cap_at is None
    assert all(derived.undecided_up_to(step) == derived.at(step) for step in range(5))   # no UNDECIDED band
    expected = tolerance.SPREAD * np.maximum(np.maximum.accumulate(steady), np.arange(5) * tolerance.UNIT_ROUNDOFF)
    assert derived.weights == pytest.approx(expected)
    assert "capped at" in derived.how


def test_the_step_floor_is_capped_on_long_runs():
    long = [0.0] * 2001        # bitwise equal calibration over 2000 steps: only the floor s * u remains
    derived = tolerance.derive(_calibration(long))
    assert derived.exceeded_cap_at is None                                  # the floor alone is no drift
    assert derived.weights[-1] == tolerance.CAP < tolerance.SPREAD * 2000 * tolerance.UNIT_ROUNDOFF


def test_the_compute_dtype_sets_the_cap_the_floor_and_the_order_limit():
    """Note [Tolerance from the compute dtype]: bfloat16 (u = 2^-8) against float32 on the same calibration."""
    steady = [0.0, 4e-3, 4e-3, 4e-3]  # the bfloat16 MLP's calibration with split gradients
    in_float32 = tolerance.derive(_calibration(steady))
    assert in_float32.order_sensitive and in_float32.cap == 2.0 ** -12  # far beyond float32 rounding
    split = tolerance.derive(_calibration(steady), "bfloat16", split=True)
    assert split.cap == 2.0 ** -4 and split.exceeded_cap_at is None and not split.order_sensitive
    np.testing.assert_allclose(split.weights, [0.0] + [tolerance.SPLIT_SPREAD * 4e-3] * 3)
    assert "bfloat16 (u = 2^-8)" in split.how and split.low_precision and not in_float32.low_precision
    # a calibration that rounds to the same bits: the floor is two units of the compute dtype, not growing
    quiet = tolerance.derive(_calibration([0.0, 0.0, 0.0, 0.0]), "bfloat16")
    np.testing.assert_allclose(quiet.weights[1:], 2 * 2.0 ** -8)


def test_a_first_step_loss_that_moves_means_position_dependence_in_any_dtype():
    moved = _calibration([0.0, 1e-4, 1e-4])
    moved.losses = np.array([np.nan, 3e-2, 3e-2])   # the forward pass alone changed: masks follow positions
    derived = tolerance.derive(moved, "bfloat16")
    assert derived.order_sensitive and "first step's loss" in derived.how
