"""Buckets, overlap, profiles, and a simulated sweep end to end (no TensorFlow run)."""
import hashlib
import json
import os
import re

import pandas as pd
import pytest

from bench.records import read_summary
from bench.simulate.cluster_profile import PROFILES_DIR, load_cluster_profile
from bench.simulate.step_model import lay_out_buckets, predict_step

from bench_helpers import fake_profile

pytestmark = pytest.mark.timeout(60)


def test_buckets_close_at_the_threshold_like_the_engine():
    gradients = [{"bytes": b, "ready_fraction": i / 10} for i, b in enumerate([10, 10, 30, 5, 50, 1])]
    buckets = lay_out_buckets(gradients, threshold_bytes=32)
    assert [b.nbytes for b in buckets] == [50, 55, 1]
    assert [b.ready_fraction for b in buckets] == [0.2, 0.4, 0.5]
    assert [b.nbytes for b in lay_out_buckets(gradients, 0)] == [10, 10, 30, 5, 50, 1]


@pytest.mark.parametrize("name", ["hpc_da", "supermuc_ng", "this_machine", "horovod_pascal_roce"])
def test_shipped_profiles_load_and_name_a_source_for_every_figure(name):
    cluster = load_cluster_profile(name)
    assert cluster.devices_per_node >= 1 and cluster.max_devices >= 4
    assert cluster.intra.bandwidth_Bps > 0 and cluster.inter.latency_s > 0
    assert cluster.source
    header_comment = False
    for line in cluster.text.splitlines():
        line = line.strip()
        if line.startswith("["):
            header_comment = "#" in line
        elif re.match(r"^[a-z_]+\s*=\s*[0-9.]", line):
            assert "#" in line or header_comment, f"{name}: no source for {line!r}"


@pytest.mark.parametrize("spelling", ["hpc_da", "hpc-da", "HPC-DA", "Hpc_Da"])
def test_profile_names_accept_the_spelling_of_the_plots(spelling):
    assert load_cluster_profile(spelling).name == "HPC-DA"


def test_overlap_hides_communication():
    cluster = load_cluster_profile("supermuc_ng")
    profile = fake_profile()
    with_overlap = predict_step(profile, cluster, 8, 16)
    import dataclasses
    without = predict_step(profile, dataclasses.replace(cluster, overlap=False), 8, 16)
    assert with_overlap.step_s <= without.step_s
    # Without overlap every allreduce waits for backprop; copies overlap the allreduces.
    assert without.compute_s + without.communication_s < without.step_s
    assert without.step_s <= without.compute_s + without.copy_s + without.communication_s + 1e-12
    assert predict_step(profile, cluster, 8, 1).communication_s == 0.0
    assert predict_step(profile, cluster, 8, 16, exchange_gradients=False).communication_s == 0.0


def test_simulated_sweep_writes_marked_rows_and_plots(run_cli, profile_file, tmp_path):
    out = tmp_path / "sim"
    code, stdout, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1..96", "--simulate",
                                "--cluster", "hpc_da", "--model-profile", profile_file, "--out", str(out),
                                "--quiet")
    assert code == 0, err
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["devices"]) == [1, 2, 4, 8, 16, 32, 64, 96]
    assert runs["simulated"].all() and (runs["cluster"] == "HPC-DA").all()
    assert runs.loc[runs["devices"] == 1, "speedup"].item() == pytest.approx(1.0)
    assert (runs["epoch_time_s"] > 0).all() and (runs["throughput"] > 0).all()
    assert (runs["speedup"] <= runs["devices"] + 1e-9).all()
    assert (runs["efficiency"] < 1.0).sum() == len(runs) - 1          # not linear by construction
    summary = read_summary(str(out))
    assert all(point["simulated"] for point in summary["points"])
    assert summary["cluster"]["name"] == "HPC-DA"
    text = open(os.path.join(PROFILES_DIR, "hpc_da.toml")).read()
    assert summary["cluster"]["contents"] == text
    assert summary["cluster"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (runs["cluster_sha256"] == summary["cluster"]["sha256"]).all()
    for name in ("epoch_time.png", "epoch_time.svg", "speedup.png", "speedup.svg", "profile.json"):
        assert os.path.getsize(out / name) > 0
    assert "simulated: HPC-DA" in (out / "speedup.svg").read_text()


def test_sweep_without_one_device_has_speedups_against_a_simulated_one(run_cli, profile_file, tmp_path):
    out = tmp_path / "no1"
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "6,12,24", "--simulate",
                           "--cluster", "hpc-da", "--model-profile", profile_file, "--out", str(out),
                           "--no-plots", "--quiet")
    assert code == 0, err
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["devices"]) == [6, 12, 24]
    assert runs["speedup"].notna().all() and (runs["speedup"] > 1).all()
    assert (runs["speedup_baseline"] == "simulated 1 device on HPC-DA").all()


def test_plot_overlays_directories(run_cli, profile_file, tmp_path):
    for cluster in ("hpc_da", "supermuc_ng"):
        code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1..8", "--simulate",
                               "--cluster", cluster, "--model-profile", profile_file,
                               "--out", str(tmp_path / cluster), "--no-plots", "--quiet")
        assert code == 0, err
    code, stdout, err = run_cli("plot", str(tmp_path / "hpc_da"), str(tmp_path / "supermuc_ng"),
                                "--out", str(tmp_path / "both"))
    assert code == 0, err
    svg = (tmp_path / "both" / "epoch_time.svg").read_text()
    assert "simulated: HPC-DA" in svg and "simulated: SuperMUC-NG" in svg


def test_profile_of_another_model_is_refused(run_cli, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(fake_profile(model="transformer_tiny")))
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1..4", "--simulate",
                           "--cluster", "hpc_da", "--model-profile", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "is of model 'transformer_tiny'" in err


@pytest.mark.parametrize("micro_batch, noted", [("8", False), ("16", False), ("64", True)])
def test_a_profile_measured_far_from_the_simulated_micro_batch_is_noted(run_cli, profile_file, tmp_path,
                                                                       micro_batch, noted):
    """The profile's step scales linearly in the micro-batch, which a real model's cost per example does not
    (ResNet-50 here: 0.92 core-s per image at 8, 0.35 at 64): more than 2x from the profile's 8, a note."""
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--devices", "1,4", "--simulate",
                           "--cluster", "supermuc_ng", "--model-profile", profile_file, "--micro-batch", micro_batch,
                           "--out", str(tmp_path / "sweep"), "--no-plots", "--quiet")
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("tnt-bench: note: the model profile")]
    assert len(notes) == (1 if noted else 0), err
    if noted:
        assert "micro-batch 8" in notes[0] and "micro-batch 64" in notes[0]


def test_no_micro_batch_note_where_the_cluster_publishes_the_models_throughput(run_cli, tmp_path):
    """HPC-DA states the Transformer's V100 throughput (Vaswani et al.): the profile times nothing there, so its
    micro-batch is no reason for a note; SuperMUC-NG states none, and computes from the profile."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps(fake_profile(model="transformer")))
    for cluster, noted in (("hpc_da", False), ("supermuc_ng", True)):
        code, _, err = run_cli("scaling", "--model", "transformer", "--devices", "1,4", "--simulate",
                               "--cluster", cluster, "--model-profile", str(path), "--micro-batch", "64",
                               "--out", str(tmp_path / cluster), "--no-plots", "--quiet")
        assert code == 0, err
        assert ("tnt-bench: note: the model profile" in err) == noted, (cluster, err)
    runs = pd.read_csv(tmp_path / "hpc_da" / "runs.csv")
    assert (runs["predicted_compute_source"] == "published").all()
