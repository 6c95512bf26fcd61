"""Mixed precision in the library (issue 23 §3): Keras's dynamic loss scale decides as serial Keras does on
every rank, step for step, and the gradients are summed in float32 (tests/keras/programs/loss_scale.py)."""
import os

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "loss_scale.py")
CHECKS = ["the loss scale and the skipped steps are serial's, step for step",
          "weights within float16's rounding of serial's, the same on every rank",
          "the gradients are summed in float32", "done"]


@pytest.mark.multirank
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [2, 4])
def test_loss_scale_decisions_are_serials_on_every_rank(ranks):
    result = run_ranks(ranks, PROGRAM, timeout=180, env={"TF_CPP_MIN_LOG_LEVEL": "2"}).check()
    result.assert_printed(CHECKS, range(ranks))
