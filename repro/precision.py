"""The precision a model computes in, and what the checker derives from it.

Note [Tolerance from the compute dtype]
A reassociation of the batch sum (the ranks' split, the calibration's reversal)
moves a result by a few units of the roundoff u of the dtype the sum is rounded
in. Under a mixed-precision policy the variables stay float32 but the layers
compute in bfloat16 or float16, and their gradients are rounded there: a bias
gradient (a reduce_sum over the batch in bfloat16) moves by ~1e-2 of itself
when two ranks sum halves, where float32 would move it by ~1e-7. So every
figure the checker derives from u takes the u of the model's compute dtype:
the lowest precision any layer with weights computes in (its dtype policy's
compute_dtype; one bfloat16 layer in a float32 model makes it bfloat16):

    dtype      u        cap = sqrt(u)   (Note [Tolerance cap])
    float64    2^-53    2^-26.5
    float32    2^-24    2^-12
    float16    2^-11    2^-5.5  (~0.022)
    bfloat16   2^-8     2^-4    (0.0625)

- the tolerance floor (repro/tolerance.py): the variables are float32 and
  accumulate the updates there, so the floor grows by float32's u per step as
  before; a low-precision compute dtype adds COMPUTE_FLOOR = 2 of its units, one
  rounding of a gradient in each of the two runs compared, not growing with the
  steps (the float32 optimizer does not accumulate them beyond: the bfloat16 MLP
  of tests/repro, Adam, 2 ranks, stayed 2.7e-4 .. 4.0e-3 from serial over 8
  steps). Not 16 x step x u: in bfloat16 that is the cap from the first step,
  and a rank dropping its gradient (0.06 after 8 steps) would pass;
- the cap: sqrt(u), at which half of the compute dtype's significand bits of a
  variable's largest weight differ; rounding in a stable training stays below
  it, a bug does not (the planted defects of tests/repro: a rank dropping its
  gradient, ranks deciding a loss scale differently), whatever the dtype;
- the rounding level of a variable (Note [Variables at the rounding level] in
  repro/compare.py): a variable below sqrt(u) of the model's largest weight
  keeps no more than half of the compute dtype's bits once added to
  activations of the model's scale (after a few bfloat16 steps the biases are);
- what the calibration may move after one step before the model counts as
  treating samples by position: sqrt(u) for the weights; for the loss of the
  first step (computed on the same weights by a forward pass whose per-sample
  values do not depend on their order), sqrt of float32's u, whatever the
  compute dtype, since Keras takes losses in float32.
"""
from __future__ import annotations

import math

__all__ = ["FLOAT32", "COMPUTE_FLOOR", "UNIT_ROUNDOFFS", "unit_roundoff", "cap", "rounding_level", "lowest", "describe",
           "LOSS_ORDER_LIMIT"]

FLOAT32 = "float32"
UNIT_ROUNDOFFS = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
_EXPONENTS = {"float64": -53, "float32": -24, "float16": -11, "bfloat16": -8}
LOSS_ORDER_LIMIT = math.sqrt(UNIT_ROUNDOFFS[FLOAT32])
COMPUTE_FLOOR = 2.0  # units of the compute dtype's roundoff the tolerance allows at least (in low precision)


def _known(dtype: str) -> str:
    return dtype if dtype in UNIT_ROUNDOFFS else FLOAT32


def unit_roundoff(dtype: str) -> float:
    return UNIT_ROUNDOFFS[_known(dtype)]


def cap(dtype: str) -> float:
    return math.sqrt(unit_roundoff(dtype))


def rounding_level(dtype: str) -> float:
    return math.sqrt(unit_roundoff(dtype))


def lowest(dtypes) -> str:
    """The dtype of largest unit roundoff among `dtypes` (float32 when none is known)."""
    known = [_known(d) for d in dtypes if d]
    return max(known, key=unit_roundoff, default=FLOAT32)


def describe(dtype: str) -> str:
    """'bfloat16 (u = 2^-8)'."""
    dtype = _known(dtype)
    return f"{dtype} (u = 2^{_EXPONENTS[dtype]})"
