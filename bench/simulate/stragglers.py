"""Stragglers: a synchronous step lasts as long as its slowest rank.

Every rank's compute time per step is a draw from one distribution: normal, with the
mean the compute model predicts and the spread (coefficient of variation, std / mean)
that a run measured on this machine showed from step to step (the 1-device run's
step times in profile.json), unless the cluster profile states its own ([stragglers]
cv, with its source). The step waits for the maximum of N draws, whose expectation is
    mean x (1 + cv x e(N)),   e(N) = E[max of N standard normal draws]
(e(1) = 0, e(2) = 0.56, e(16) = 1.77, e(96) = 2.49, e(512) = 3.04): straggling grows
with the rank count even when no rank is slower on average.
"""
from __future__ import annotations

import functools
import math
import statistics

import numpy as np

__all__ = ["MIN_STEPS", "expected_max_standard_normal", "measured_cv", "straggler_factor"]


@functools.lru_cache(maxsize=None)
def expected_max_standard_normal(draws: int) -> float:
    """E[max of `draws` independent N(0, 1)], by integrating x d(Phi(x)^N)."""
    if draws <= 1:
        return 0.0
    x = np.linspace(-9.0, 9.0, 36001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    density = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    integrand = x * draws * density * cdf ** (draws - 1)
    return float(np.trapezoid(integrand, x))


# Fewer timed steps say too little about the spread (2 steps of a loaded machine gave 17%).
MIN_STEPS = 5


def measured_cv(step_times: list[float]) -> float:
    """std / mean of a run's step times; 0 (unknown) with fewer than MIN_STEPS steps."""
    if len(step_times) < MIN_STEPS:
        return 0.0
    return statistics.pstdev(step_times) / statistics.fmean(step_times)


def straggler_factor(cv: float, ranks: int) -> float:
    """Expected slowest-of-`ranks` compute time over the mean one."""
    return 1.0 + cv * expected_max_standard_normal(ranks)
