"""tnt-bench train on the mini benchmark: reaches its target, logs MLPerf's :::MLLOG lines that
MLCommons' compliance checker accepts (bench/mlperf/compliance.py); so do the shipped logs."""
import glob
import json
import os
import subprocess
import sys

import pytest

from bench.mlperf import compliance
from bench.mlperf.log import read_events
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
    events = read_events((tmp_path / "mllog.log").read_text())
    keys = [e["key"] for e in events]
    for key in ("submission_benchmark", "submission_division", "cache_clear", "seed", "global_batch_size",
                "opt_base_learning_rate", "train_samples", "eval_samples", "quality_target", "init_start",
                "init_stop", "run_start", "epoch_start", "eval_accuracy", "run_stop"):
        assert key in keys, key
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
    assert events[-1]["metadata"]["status"] == "success"
    assert {e["event_type"] for e in events} == {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"}
    assert compliance.check_log(str(tmp_path / "mllog.log")) == []


SHIPPED_LOGS = sorted(glob.glob(os.path.join(REPO, "results", "bench", "*", "mllog.log")))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", SHIPPED_LOGS, ids=[os.path.basename(os.path.dirname(p)) for p in SHIPPED_LOGS])
def test_shipped_time_to_accuracy_logs_pass_the_compliance_checker(path):
    assert compliance.check_log(path) == []


@pytest.mark.timeout(30)
def test_the_compliance_checker_rejects_what_mlperf_rejects(tmp_path):
    """A log missing what the issue found missing (division, cache_clear, eval_samples), or whose run
    claims success below the target, is rejected: the check can fail."""
    good = [line for line in open(SHIPPED_LOGS[0]).read().splitlines() if line.strip()]
    for dropped in ("submission_division", "cache_clear", "eval_samples", "seed"):
        path = tmp_path / f"without_{dropped}.log"
        path.write_text("\n".join(line for line in good if f'"key": "{dropped}"' not in line) + "\n")
        messages = compliance.check_log(str(path))
        assert any(dropped in message for message in messages), (dropped, messages)
    lowered = [line.replace('"key": "quality_target", "value": 0.95', '"key": "quality_target", "value": 0.9999')
               for line in good]
    path = tmp_path / "success_below_target.log"
    path.write_text("\n".join(lowered) + "\n")
    assert any("run_stop" in message for message in compliance.check_log(str(path)))


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
