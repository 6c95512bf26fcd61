"""`tnt-bench validate DIR --cluster PROFILE`: predict a measured sweep's counts out of sample.

Note [Out-of-sample validation on this machine]
The prediction of every count uses only what one rank measured: the 1-device model
profile (profile.json, measured at 1 rank: phases, gradient timeline, the cores it
used) and the 1-device run's step times (their spread gives the stragglers), plus a
cluster profile whose figures are facts or 1-process measurements (this_machine.toml:
cores, `tnt-bench calibrate` memory bandwidth). No run on 2 or more ranks informs it,
so the errors at 2 and 4 ranks are out of sample; the 1-device row is the calibration
point and is marked so (its error says only how well fixed + per-example reproduces
the measured step). The simulated rows of that cluster in runs.csv are replaced, the
plots redrawn, and validation.csv/.json written with the profile's contents and hash.
"""
from __future__ import annotations

import json
import math
import os

from bench import records
from bench.errors import BenchUsageError
from bench.machine import describe_software
from bench.models.registry import get_model_entry
from bench.simulate.cluster_profile import load_cluster_profile
from bench.simulate.model_profile import load_profile
from bench.sweep.options import SweepOptions
from bench.sweep.scaling import complete_row, simulate_rows, summary_points
from bench.validation.record import validation_points, write_validation

__all__ = ["revalidate"]

# What a simulated row shares with the measured rows of its sweep.
_SWEEP_KEYS = ("sweep", "model", "framework", "scaling", "timestamp", "hostname", "cpu_model", "cpus",
               "physical_cores", "memory_gib", "os", "git_commit", "git_dirty")


def _rows_of(directory: str) -> list[dict]:
    frame = records.read_runs(directory)
    rows = []
    for raw in frame.to_dict("records"):
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in raw.items()}
        row["simulated"] = bool(row["simulated"])
        row["oversubscribed"] = bool(row["oversubscribed"])
        row["step_times_s"] = json.loads(row["step_times_s"]) if isinstance(row["step_times_s"], str) else []
        rows.append(row)
    return rows


def _one_rank_profile(directory: str, measured: list[dict]) -> dict:
    profile = load_profile(os.path.join(directory, "profile.json"))
    one = [r for r in measured if r["devices"] == 1]
    if not one:
        raise BenchUsageError(f"{directory} has no measured 1-device run: the out-of-sample validation "
                              f"predicts from 1-rank data only; measure with --devices 1,2,4")
    if not profile.get("step_times_s"):
        profile["step_times_s"] = one[0]["step_times_s"]     # older profiles: the same run's steps
    return profile


def revalidate(directory: str, cluster_name: str, command: str = "") -> dict:
    for needed in ("runs.csv", "profile.json", "summary.json"):
        if not os.path.exists(os.path.join(directory, needed)):
            raise BenchUsageError(f"{directory} holds no {needed}: validate needs a measured sweep directory")
    cluster = load_cluster_profile(cluster_name)
    rows = _rows_of(directory)
    measured = [r for r in rows if not r["simulated"]]
    if not measured:
        raise BenchUsageError(f"{directory} has no measured runs to validate against")
    profile = _one_rank_profile(directory, measured)
    kept = [r for r in rows if r["simulated"] and r["cluster"] != cluster.name]
    first = measured[0]
    entry = get_model_entry(first["model"])
    weak = first["scaling"] == "weak"
    options = SweepOptions(model=first["model"], counts=[int(r["devices"]) for r in measured],
                           framework=first["framework"], command=command, data=first["data"],
                           input_sharding="after-decode" if first.get("input_sharding") == "after-decode" else "files",
                           micro_batch=int(first["micro_batch"]) if weak else None,
                           global_batch=None if weak else int(first["global_batch"]))
    common = {key: first[key] for key in _SWEEP_KEYS}
    common.update(describe_software(), data=first["data"])
    fresh = [complete_row(row, options, entry, int(first["epoch_examples"]), common)
             for row in simulate_rows(options, entry, profile, cluster, options.counts)]
    rows = measured + kept + fresh
    records.derive_figures(rows)
    records.write_runs(rows, directory)
    points = validation_points(measured, fresh)
    write_validation(directory, points, cluster, command,
                     {"model": entry.name, "sweep": directory, "predicted_from": "1-rank data only: "
                      "profile.json and the 1-device run's step times (Note [Out-of-sample validation "
                      "on this machine])"})
    summary = records.read_summary(directory)
    summary.update(points=summary_points(rows), validation=points, cluster=cluster.describe())
    summary.setdefault("revalidated", []).append(command)
    from bench.plots import plot_directories
    plot_directories([directory], directory)
    records.write_summary(summary, directory)
    return summary
