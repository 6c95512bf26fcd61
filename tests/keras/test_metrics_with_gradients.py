"""The metric state summed in the gradient reduction (Note [Metric state rides with the gradients]):
the same logs, bit for bit, as the separate reduction after the gradients, and serial Keras's."""
import json
import re

import pytest

from tests.launches import TRAINING



@TRAINING.test("metrics_with_gradients")
@pytest.mark.parametrize("ranks", [1, 2])
def test_metric_state_riding_with_gradients_is_exact(ranks):
    # Quiet, about 30 s: three models trained on each rank (serial, riding, after).
    run = TRAINING.run("metrics_with_gradients", ranks).check()
    results = [json.loads(match) for match in re.findall(r"RESULT (\{.*\})", run.stdout)]
    assert {r["rank"] for r in results} == set(range(ranks)), run.describe()
    for result in results:
        assert result["steps"] == 2 * 11 and "top2" in result["keys"] and "accuracy" in result["keys"]
        assert result["batch_logs_identical"] and result["epoch_logs_identical"], result
        assert result["evaluate_identical"] and result["weights_identical"], result
        # accuracy and top-2 count samples: exact; the loss to float rounding
        assert result["batch_metrics_vs_serial"] < 1e-6 and result["history_vs_serial"] < 1e-5, result
        if ranks == 1:  # nothing to reduce
            assert result["riding_state_tensors"] == 0 and result["riding_purposes"] == [], result
        else:  # one reduction per train step, or two
            assert result["riding_state_tensors"] > 0 and result["riding_purposes"] == ["gradients"], result
            assert result["after_state_tensors"] == 0, result
            assert result["after_purposes"] == ["gradients", "metrics"], result
