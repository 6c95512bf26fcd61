"""tnt-bench validate: fresh predictions for a measured sweep's counts, without running it."""
import pandas as pd
import pytest

pytestmark = pytest.mark.timeout(60)


def test_validate_rewrites_predictions_and_errors(run_cli, profile_file, tmp_path):
    out = tmp_path / "sweep"
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1,2,4", "--simulate",
                           "--cluster", "supermuc_ng", "--model-profile", profile_file, "--out", str(out),
                           "--no-plots", "--quiet")
    assert code == 0, err
    runs = pd.read_csv(out / "runs.csv")          # pretend these were measured
    runs["simulated"] = False
    runs["cluster"] = None
    runs.to_csv(out / "runs.csv", index=False)

    code, stdout, err = run_cli("validate", str(out), "--cluster", "this_machine")
    assert code == 0, err
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["simulated"]) == [False] * 3 + [True] * 3
    assert (runs.loc[runs["simulated"], "cluster"] == "this-machine").all()
    validation = pd.read_csv(out / "validation.csv")
    assert list(validation["devices"]) == [1, 2, 4]
    assert validation["relative_error"].notna().all()
    assert (out / "speedup.svg").exists()

    code, _, err = run_cli("validate", str(tmp_path / "nothing"))
    assert code == 2 and "holds no runs.csv" in err
