"""Mixed precision in the library (issue 23 §3): Keras's dynamic loss scale decides as serial Keras does on
every rank, step for step, and the gradients are summed in float32 (tests/keras/programs/loss_scale.py)."""

import pytest

from tests.launches import TRAINING

CHECKS = ["the loss scale and the skipped steps are serial's, step for step",
          "weights within float16's rounding of serial's, the same on every rank",
          "the gradients are summed in float32", "done"]


@TRAINING.test("loss_scale")
@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.extended)])
def test_loss_scale_decisions_are_serials_on_every_rank(ranks):
    result = TRAINING.run("loss_scale", ranks).check()
    result.assert_printed(CHECKS, range(ranks))
