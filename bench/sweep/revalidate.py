"""`tnt-bench validate DIR --cluster PROFILE`: predict a measured sweep's device counts again.

For a sweep measured earlier (its runs.csv and profile.json), replace the simulated rows
of that cluster by fresh predictions and rewrite validation.csv, runs.csv, summary.json
and the plots; the measured rows stay as they were. Used after the cluster profile or
the simulation changed, without measuring again.
"""
from __future__ import annotations

import json
import math
import os

import pandas as pd

from bench import records
from bench.errors import BenchUsageError
from bench.machine import describe_software
from bench.models.registry import get_model_entry
from bench.simulate.cluster_profile import load_cluster_profile
from bench.simulate.model_profile import load_profile
from bench.sweep.options import SweepOptions
from bench.sweep.scaling import complete_row, simulate_rows, summary_points, validation_table

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


def revalidate(directory: str, cluster_name: str, command: str = "") -> dict:
    for needed in ("runs.csv", "profile.json", "summary.json"):
        if not os.path.exists(os.path.join(directory, needed)):
            raise BenchUsageError(f"{directory} holds no {needed}: validate needs a measured sweep directory")
    cluster = load_cluster_profile(cluster_name)
    rows = _rows_of(directory)
    measured = [r for r in rows if not r["simulated"]]
    if not measured:
        raise BenchUsageError(f"{directory} has no measured runs to validate against")
    kept = [r for r in rows if r["simulated"] and r["cluster"] != cluster.name]
    first = measured[0]
    entry = get_model_entry(first["model"])
    weak = first["scaling"] == "weak"
    options = SweepOptions(model=first["model"], counts=[int(r["devices"]) for r in measured],
                           framework=first["framework"], command=command,
                           micro_batch=int(first["micro_batch"]) if weak else None,
                           global_batch=None if weak else int(first["global_batch"]))
    common = {key: first[key] for key in _SWEEP_KEYS}
    common.update(describe_software(), data=first["data"])
    fresh = simulate_rows(options, entry, load_profile(os.path.join(directory, "profile.json")), cluster,
                          options.counts)
    fresh = [complete_row(row, options, entry, int(first["epoch_examples"]),
                          common) for row in fresh]
    rows = measured + kept + fresh
    records.derive_figures(rows)
    records.write_runs(rows, directory)
    validation = validation_table(rows)
    pd.DataFrame(validation).to_csv(os.path.join(directory, "validation.csv"), index=False)
    summary = records.read_summary(directory)
    summary.update(points=summary_points(rows), validation=validation,
                   cluster={"name": cluster.name, "description": cluster.description,
                            "source": cluster.source, "profile": cluster.path})
    summary.setdefault("revalidated", []).append(command)
    from bench.plots import plot_directories
    plot_directories([directory], directory)
    records.write_summary(summary, directory)
    return summary
