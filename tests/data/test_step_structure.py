"""A model's own train/test/predict step receives, for every input form Keras accepts, the structure plain
Keras hands it (programs/step_structure.py checks all forms in one launch), at 1, 2 and 3 ranks."""
import re

import pytest

from tests.launches import TRAINING

FORMS = 19  # entries of the program's FORMS


@TRAINING.test("step_structure")
@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.extended)])   # tests/conftest.py's tiers
def test_own_steps_receive_what_serial_keras_hands_them(n):
    run = TRAINING.run("step_structure", n).check()
    for rank in range(n):
        lines = [line for line in run.rank_stdout[rank].splitlines() if line.startswith("STRUCTURE ")]
        assert len(lines) == FORMS, (rank, run.stdout[-3000:], run.stderr[-3000:])
        differing = [line for line in lines if not re.search(r" ok$", line)]
        assert not differing, (rank, differing)


def test_sample_weight_without_targets_is_refused():
    import numpy as np
    from tarantella.data import user_input
    with pytest.raises(ValueError, match="`sample_weight` was given without targets `y`"):
        user_input.distribute(np.ones((4, 2)), None, np.ones(4), batch_size=2, size=1, rank=0)
