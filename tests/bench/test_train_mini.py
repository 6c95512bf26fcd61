"""tnt-bench train on the mini benchmark: reaches its target, logs MLPerf's :::MLLOG lines."""
import json
import os
import subprocess
import sys

import pytest

from bench.mllog import parse_mllog
from bench.specs import learning_rate_at, load_spec, scaled_learning_rate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(150)
def test_mini_digits_reaches_its_target(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "train", "--benchmark", "mini_digits",
                           "--framework", "keras", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=130, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "result.json").read_text())
    result = record["result"]
    assert result["reached"] and result["time_to_target_s"] > 0
    assert result["evaluations"][-1]["quality"] >= 0.95
    assert record["machine"]["hostname"] and record["spec"]["quality_target"] == 0.95
    events = parse_mllog((tmp_path / "mllog.log").read_text())
    keys = [e["key"] for e in events]
    for key in ("submission_benchmark", "global_batch_size", "opt_base_learning_rate", "init_start",
                "init_stop", "run_start", "epoch_start", "eval_accuracy", "run_stop"):
        assert key in keys, key
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
    assert events[-1]["metadata"]["status"] == "success"
    assert {e["event_type"] for e in events} == {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"}


@pytest.mark.timeout(10)
def test_learning_rate_warms_up_and_scales_with_the_global_batch():
    reference = load_spec("resnet50")["reference"]
    assert scaled_learning_rate(reference, 1024) == pytest.approx(0.4)           # 0.1 x 1024/256
    assert learning_rate_at(reference, 1024, 0, 100, 9000) == pytest.approx(0.4 / 500)
    assert learning_rate_at(reference, 1024, 499, 100, 9000) == pytest.approx(0.4)
    assert learning_rate_at(reference, 1024, 8999, 100, 9000) < 0.01
    transformer = load_spec("transformer")["reference"]
    assert scaled_learning_rate(transformer, 512) == pytest.approx(0.0007 * 2)    # sqrt rule
    assert load_spec("transformer")["quality_target"] == 25.0
    assert load_spec("resnet50")["quality_target"] == 0.759
