"""Serial semantics for layers that look at the batch (issue 19): random layers draw each sample's serial values,
BatchNormalization uses the global batch; at 1, 2 and 3 ranks (3: an uneven split, one empty micro-batch in the
partial last batch), also with steps_per_execution=3, training equals serial Keras and every rank ends with
identical variables (programs/batch_layers.py runs all cases in one launch)."""

import pytest

from tests.launches import TRAINING

TOLERANCE = 1e-5
CASES = ["dense_dropout_family", "spatial_dropout", "attention_dropout", "augmentation", "batch_norm",
         "batch_norm_synchronized", "residual_cnn_bn_dropout", "residual_cnn_bn_dropout_3_steps_per_execution"]


@TRAINING.test("batch_layers")
@pytest.mark.parametrize("n", [1, 2, 3])
def test_random_layers_and_batch_norm_train_as_serial(n):
    run = TRAINING.run("batch_layers", n).check()
    for rank in range(n):
        found = {}
        for line in run.rank_stdout[rank].splitlines():
            if line.startswith("RESULT "):
                _, case, difference, identical = line.split()
                found[case] = (float(difference), identical == "True")
        assert sorted(found) == sorted(CASES), (rank, run.stdout[-3000:], run.stderr[-3000:])
        for case, (difference, identical) in found.items():
            assert difference <= TOLERANCE and identical, (rank, case, difference, identical)
