"""tnt-bench validate: out-of-sample predictions with the profile recorded, without running anything."""
import hashlib
import json

import pandas as pd
import pytest

from bench.simulate.cluster_profile import load_cluster_profile
from bench.validation.published import load_published, predict_published

pytestmark = pytest.mark.timeout(60)


def _pretend_measured(run_cli, profile_file, out):
    """A sweep directory whose rows look measured (simulated elsewhere, with spread-out steps)."""
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1,2,4", "--simulate",
                           "--cluster", "supermuc_ng", "--model-profile", profile_file, "--out", str(out),
                           "--no-plots", "--quiet")
    assert code == 0, err
    runs = pd.read_csv(out / "runs.csv")
    runs["simulated"] = False
    runs["cluster"] = None
    runs["step_times_s"] = [json.dumps([t * 0.95, t, t * 1.05]) for t in runs["step_time_median_s"]]
    runs.to_csv(out / "runs.csv", index=False)
    return runs


def test_validate_predicts_from_one_rank_data_and_records_the_profile(run_cli, profile_file, tmp_path):
    out = tmp_path / "sweep"
    _pretend_measured(run_cli, profile_file, out)
    code, stdout, err = run_cli("validate", str(out), "--cluster", "this_machine")
    assert code == 0, err
    assert "prediction" in stdout and "calibration" in stdout
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["simulated"]) == [False] * 3 + [True] * 3
    assert (runs.loc[runs["simulated"], "cluster"] == "this-machine").all()
    validation = pd.read_csv(out / "validation.csv")
    assert list(validation["devices"]) == [1, 2, 4]
    assert list(validation["role"]) == ["calibration", "prediction", "prediction"]
    assert validation["relative_error"].notna().all()
    # The predictions do not see the 2- and 4-rank measurements: tripling them moves the error only.
    runs = pd.read_csv(out / "runs.csv")
    runs.loc[~runs["simulated"] & (runs["devices"] > 1), "step_time_median_s"] *= 3.0
    runs.to_csv(out / "runs.csv", index=False)
    assert run_cli("validate", str(out), "--cluster", "this-machine")[0] == 0
    again = pd.read_csv(out / "validation.csv")
    # (runs.csv keeps step times to the microsecond: the spread moves in the 6th digit)
    assert list(again["predicted_step_s"]) == pytest.approx(list(validation["predicted_step_s"]), rel=1e-4)
    assert list(again["measured_step_s"][1:]) == pytest.approx(list(3 * validation["measured_step_s"][1:]))
    record = json.loads((out / "validation.json").read_text())
    text = load_cluster_profile("this_machine").text
    assert record["cluster"]["contents"] == text
    assert record["cluster"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (validation["cluster_sha256"] == record["cluster"]["sha256"]).all()
    assert "1-rank data only" in record["predicted_from"]
    assert (out / "speedup.svg").exists()

    code, _, err = run_cli("validate", str(tmp_path / "nothing"))
    assert code == 2 and "holds no runs.csv" in err


def test_validate_refuses_a_sweep_without_a_measured_one_device_run(run_cli, profile_file, tmp_path):
    out = tmp_path / "sweep"
    _pretend_measured(run_cli, profile_file, out)
    runs = pd.read_csv(out / "runs.csv")
    runs[runs["devices"] != 1].to_csv(out / "runs.csv", index=False)
    code, _, err = run_cli("validate", str(out))
    assert code == 2 and "no measured 1-device run" in err


def test_published_horovod_points_are_predicted_with_errors(run_cli, tmp_path):
    published = load_published("horovod")
    assert {p["model"] for p in published["point"]} == {"resnet101", "inception_v3", "vgg16"}
    points = predict_published(published)
    assert len(points) == 6
    for point in points:
        assert 0.0 < point["predicted_efficiency"] < 1.0
        assert point["error_points"] == pytest.approx(
            100 * (point["predicted_efficiency"] - point["published_efficiency"]))
        assert point["predicted_algorithm"] == "ring"          # the profile's NCCL ring
    by_key = {(p["model"], p["devices"]): p["predicted_efficiency"] for p in points}
    assert by_key[("vgg16", 512)] < by_key[("resnet101", 512)]   # 553 MB of gradients vs 178 MB
    out = tmp_path / "horovod"
    code, stdout, err = run_cli("validate", "--published", "horovod", "--out", str(out))
    assert code == 0, err
    assert "vgg16" in stdout and "pt" in stdout
    record = json.loads((out / "validation.json").read_text())
    assert record["cluster"]["sha256"] == load_cluster_profile("horovod_pascal_roce").sha256
    assert len(pd.read_csv(out / "validation.csv")) == 6
