"""A real 1..2 sweep of the tiny ResNet through the launcher: the files and their columns.

No timing is asserted; the figures are checked for being there and consistent.
"""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from bench.records import RUN_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _framework():
    try:
        import tarantella
        return "tnt" if hasattr(tarantella, "Model") else "keras"
    except ImportError:
        return "keras"


def _tnt_bench(*argv, timeout):
    return subprocess.run([sys.executable, "-m", "bench", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_sweep_beyond_the_machine_measures_what_fits_and_simulates_the_rest(tmp_path):
    out = tmp_path / "sweep"
    # Without 1 in --devices: the 1-device run still happens (for the profile) and is the baseline.
    done = _tnt_bench("scaling", "--model", "resnet_tiny", "--devices", "2,64", "--framework", _framework(),
                      "--steps", "3", "--warmup-steps", "1", "--out", str(out), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[2/2]" in done.stderr                                    # the progress display
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    measured = runs[~runs["simulated"]]
    simulated = runs[runs["simulated"]]
    assert list(measured["devices"]) == [2]                          # what fits on 2 cores
    assert list(simulated["devices"]) == [2, 64]                     # the whole series, simulated
    assert (simulated["cluster"] == "SuperMUC-NG").all()             # the stated default
    for column in ("step_time_median_s", "throughput", "epoch_time_s", "speedup", "efficiency"):
        assert (runs[column] > 0).all(), column                      # no NaN without a 1-device row
    assert set(measured["speedup_baseline"]) == {"measured 1 device (profile run)"}
    assert set(simulated["speedup_baseline"]) == {"simulated 1 device on SuperMUC-NG"}
    assert simulated.loc[simulated["devices"] == 64, "efficiency"].item() < 1.0
    assert (measured["global_batch"] == measured["micro_batch"] * measured["devices"]).all()
    assert all(len(json.loads(times)) == 3 for times in measured["step_times_s"])
    assert (runs["throughput_unit"] == "images/s").all()
    for column in ("hostname", "cpu_model", "git_commit", "tensorflow", "keras", "mpi", "python"):
        assert runs[column].notna().all(), column

    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["name"] == "resnet_tiny"
    assert summary["measured_counts"] == [2] and summary["simulated_counts"] == [2, 64]
    assert summary["machine"]["physical_cores"] >= 1 and "git_commit" in summary["source"]
    assert summary["cluster"]["name"] == "SuperMUC-NG" and len(summary["cluster"]["sha256"]) == 64
    assert not (out / "validation.csv").exists()                     # another machine: no validation
    profile = json.loads((out / "profile.json").read_text())
    assert profile["step_s"] > 0 and len(profile["gradients"]) > 0 and len(profile["step_times_s"]) == 3
    for name in ("epoch_time.png", "epoch_time.svg", "speedup.png", "speedup.svg"):
        assert (out / name).stat().st_size > 0
    svg = (out / "speedup.svg").read_text()
    assert "measured" in svg and "simulated: SuperMUC-NG" in svg


@pytest.mark.timeout(120)
def test_tiny_transformer_runs_on_one_device_and_counts_tokens(tmp_path):
    out = tmp_path / "t"
    done = _tnt_bench("scaling", "--model", "transformer_tiny", "--devices", "1", "--framework", "keras",
                      "--steps", "2", "--warmup-steps", "1", "--out", str(out), "--no-plots", "--quiet",
                      "--precision", "mixed_bfloat16", timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = pd.read_csv(out / "runs.csv")
    row = runs.iloc[0]
    assert row["precision"] == "mixed_bfloat16"   # trained under the policy, recorded in the row
    assert row["throughput_unit"] == "tokens/s" and row["speedup"] == pytest.approx(1.0)
    assert row["throughput"] == pytest.approx(row["global_batch"] * 16 / row["step_time_median_s"])
    assert not row["simulated"]


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_a_rank_killed_mid_run_gives_the_recovery_row(tmp_path):
    """--kill-rank-at (issue 42): the 2-device run again under `tarantella --elastic`, rank 1 killed after step 3;
    the survivor goes on from the last commit and the row says after how long."""
    out = tmp_path / "sweep"
    done = _tnt_bench("scaling", "--model", "resnet_tiny", "--devices", "2", "--steps", "5", "--warmup-steps", "1",
                      "--kill-rank-at", "3", "--no-plots", "--out", str(out), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    loss = json.loads((out / "summary.json").read_text())["rank_loss"]
    assert (loss["devices"], loss["devices_after"], loss["killed_rank"], loss["killed_after_step"]) == (2, 1, 1, 3)
    assert 0 < loss["recovery_s"] < 120 and 1 <= loss["steps_redone"] <= 3, loss
    assert loss["step_time_after_s"] > 0 and "--elastic" in loss["command"]
    assert "with a rank lost (tarantella --elastic; rank 1 killed by SIGKILL after step 3)" in done.stdout
    assert not list(out.glob(".rank_loss*"))
