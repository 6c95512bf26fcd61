"""What a user reads beside the figures (issue 41 §3): measured runs whose machine was not quiet are flagged
in the table and the plot, and published measurements of the simulated cluster are drawn beside it."""
import pytest

from bench import records
from bench.cli import _print_points
from bench.plots import plot_directories, published_beside, series_of
from bench.quiet import baseline_not_quiet, not_quiet_because
from bench.sweep.runner import measured_row
from bench.sweep.scaling import flag_unquiet_baselines, summary_points
from bench.validation.published_curves import curves_for, published_curves

pytestmark = pytest.mark.timeout(60)


def result(ranks, threads, load, times, nodes=1):
    """A train_benchmark.py result line's fields."""
    return {"ranks": ranks, "nodes": nodes, "micro_batch": 32, "global_batch": 32 * ranks, "data": "synthetic",
            "warmup_steps": 1, "steps": len(times), "step_times_s": times, "threads_per_rank": threads,
            "parameters": 10, "final_loss": 1.0, "command": "c", "load_average_1m": load, "versions": {}}


@pytest.mark.parametrize("ranks, threads, load, times, because", [
    (1, 2, 3.06, [1.0, 1.01, 0.99], "load 3.06 with 2 threads of its own"),   # the 1-device run
    (1, 2, 1.83, [1.0, 1.01, 0.99], ""),                                      # quiet: the average lags
    (2, 1, 2.55, [1.0, 1.02, 0.98], ""),                                      # the engine's threads add a little
    (4, 1, 5.0, [1.0, 1.0, 1.0], "load 5.00 with 4 threads of its own"),      # oversubscribed, and one more
    (2, 1, 1.9, [1.0, 1.0, 1.6, 1.0], "step times spread 23%"),              # came and went during the run
    (1, 2, None, [1.0, 1.0, 1.0], ""),                                        # no load recorded: spread only
    (1, 2, 1.0, [0.010, 0.010, 0.016, 0.010], ""),                            # a few ms: a time slice
])
def test_a_run_that_shared_its_machine_is_not_quiet(ranks, threads, load, times, because):
    fields = result(ranks, threads, load, times)
    if load is None:
        del fields["load_average_1m"]
    row = measured_row(fields, oversubscribed=ranks > 2)
    assert row["not_quiet_because"] == because == not_quiet_because(row)
    assert row["quiet"] == (because == "")


def sweep_rows(baseline_load):
    rows = [measured_row(result(1, 2, baseline_load, [2.0, 2.0, 2.0]), False),
            measured_row(result(2, 1, 2.0, [2.1, 2.1, 2.1]), False)]
    for row in rows:
        row.update(model="resnet50_small", framework="tnt", epoch_time_s=row["step_time_median_s"] * 100,
                   throughput=1.0, throughput_unit="images/s", epoch_time_min=row["step_time_median_s"] * 100 / 60)
    records.derive_figures(rows)
    flag_unquiet_baselines(rows, None)
    return rows


def test_a_speedup_against_a_busy_baseline_is_flagged_in_the_table(capsys):
    rows = sweep_rows(baseline_load=3.06)
    assert not rows[0]["quiet"] and rows[1]["quiet"]
    assert "not quiet: load 3.06" in rows[1]["speedup_baseline"]
    _print_points({"model": {"unit": "images", "name": "resnet50_small"}, "points": summary_points(rows)})
    table = capsys.readouterr().out.splitlines()
    assert table[1].endswith("NOT QUIET: load 3.06 with 2 threads of its own")   # not also "against" itself
    assert not baseline_not_quiet(rows[0]["speedup_baseline"])
    assert table[2].endswith("quiet; speedup against a 1-device run that was not quiet")
    assert table[3].startswith("tnt-bench: a run marked 'not quiet'")


def test_a_quiet_sweep_says_so_and_nothing_more(capsys):
    rows = sweep_rows(baseline_load=1.5)
    _print_points({"model": {"unit": "images", "name": "resnet50_small"}, "points": summary_points(rows)})
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[1].endswith("  quiet") and table[2].endswith("  quiet")


def test_the_plot_crosses_the_busy_points(tmp_path):
    records.write_runs(sweep_rows(baseline_load=3.06), str(tmp_path))
    plot_directories([str(tmp_path)], str(tmp_path))
    assert (tmp_path / "speedup.svg").read_text().count("machine not quiet") == 1
    assert "machine not quiet" in (tmp_path / "epoch_time.svg").read_text()


def test_published_curves_carry_their_source_and_their_own_speedups():
    curves = {curve.cluster: curve for curve in published_curves()}
    assert set(curves) == {"SuperMUC-NG", "HPC-DA"}
    assert curves["SuperMUC-NG"].speedups[curves["SuperMUC-NG"].devices.index(4)] == pytest.approx(1.479, abs=1e-3)
    assert curves["HPC-DA"].speedups[-1] == pytest.approx(66.77 / 1.16)
    assert all("Tarantella" in curve.source and "Fig." in curve.label for curve in curves.values())


@pytest.mark.parametrize("model, cluster, shown", [
    ("resnet50_small", "SuperMUC-NG", ["Fig. 1"]), ("resnet50", "hpc_da", ["Fig. 2"]),
    ("transformer_small", "SuperMUC-NG", []), ("resnet50_small", "this_machine", []),
])
def test_published_points_are_shown_beside_their_own_cluster_and_model(model, cluster, shown):
    assert [curve.label.split("(")[-1].split(")")[0].split(", ")[-1] for curve in curves_for(model, cluster)] == shown


def test_the_main_jobs_plot_and_table_show_the_published_points(run_cli, tmp_path, capsys):
    import json

    from bench_helpers import fake_profile
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(fake_profile("resnet50_small")))
    code, stdout, err = run_cli("scaling", "--model", "resnet50_small", "--devices", "1..96", "--simulate",
                                "--cluster", "supermuc_ng", "--model-profile", str(profile),
                                "--out", str(tmp_path / "sweep"), "--quiet")
    assert code == 0, err
    assert "published: ResNet-50, ImageNet 224x224, micro-batch 64 (Tarantella docs, Fig. 1) on SuperMUC-NG" in stdout
    line = next(line for line in stdout.splitlines() if line.split()[:2] == ["4", "1.48x"])
    assert line.split()[-1].endswith("x")                 # the simulated speedup at 4, beside it
    assert "published: ResNet-50" in (tmp_path / "sweep" / "speedup.svg").read_text()
    # minutes per epoch are another workload's: only beside the published model itself
    assert "published: ResNet-50" not in (tmp_path / "sweep" / "epoch_time.svg").read_text()
    series = series_of(records.read_runs(str(tmp_path / "sweep")), str(tmp_path / "sweep"))
    [(label, devices, speedups)] = published_beside(series, 96, "speedup")
    assert devices == [1, 4, 8, 16, 32, 64] and speedups[0] == 1.0
