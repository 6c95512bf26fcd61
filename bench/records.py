"""The files a sweep writes, and reads back for plotting (ARCHITECTURE rule 12).

    runs.csv      one row per run (measured or simulated) with every option, the raw
                  step times, derived figures, machine, source and software versions
    summary.json  the sweep's options, machine, source, and per device count the
                  figures plotted: epoch minutes, speedup, efficiency; simulated marked

Columns of runs.csv (RUN_COLUMNS) are documented in bench/README.md.
"""
from __future__ import annotations

import json
import os

__all__ = ["RUN_COLUMNS", "derive_figures", "write_runs", "read_runs", "write_summary",
           "read_summary"]

RUN_COLUMNS = [
    "sweep", "model", "framework", "devices", "nodes", "devices_per_node", "simulated",
    "cluster", "oversubscribed", "micro_batch", "global_batch", "scaling", "data",
    "warmup_steps", "steps", "step_time_median_s", "step_time_mean_s", "step_time_min_s",
    "step_time_max_s", "step_time_std_s", "step_times_s", "throughput", "throughput_unit",
    "epoch_examples", "epoch_time_s", "epoch_time_min", "speedup", "efficiency",
    "threads_per_rank", "parameters", "final_loss", "timestamp", "hostname", "cpu_model",
    "cpus", "physical_cores", "memory_gib", "os", "load_average_1m", "git_commit", "git_dirty", "python",
    "tensorflow", "keras", "tarantella", "numpy", "mpi", "command",
]


def derive_figures(rows: list[dict]) -> list[dict]:
    """Fill throughput, epoch time, speedup and efficiency, per (framework, simulated, cluster).

    Speedup is the 1-device epoch time over this row's; rows with no 1-device run of
    their own kind get none (NaN), rather than one against a different baseline.
    """
    baselines = {}
    for row in rows:
        if row["devices"] == 1:
            baselines[_kind(row)] = row["epoch_time_s"]
    for row in rows:
        base = baselines.get(_kind(row))
        row["speedup"] = base / row["epoch_time_s"] if base else float("nan")
        row["efficiency"] = row["speedup"] / row["devices"] if base else float("nan")
    return rows


def _kind(row):
    return (row["model"], row["framework"], bool(row["simulated"]), row.get("cluster") or "")


def write_runs(rows: list[dict], directory: str) -> str:
    import pandas as pd
    os.makedirs(directory, exist_ok=True)
    frame = pd.DataFrame(rows)
    for column in RUN_COLUMNS:
        if column not in frame:
            frame[column] = None
    extra = [c for c in frame.columns if c not in RUN_COLUMNS]
    frame = frame[RUN_COLUMNS + extra]
    frame["step_times_s"] = frame["step_times_s"].map(
        lambda times: json.dumps([round(t, 6) for t in times]) if isinstance(times, list) else times)
    path = os.path.join(directory, "runs.csv")
    frame.to_csv(path, index=False)
    return path


def read_runs(directory: str):
    import pandas as pd
    return pd.read_csv(os.path.join(directory, "runs.csv"))


def write_summary(summary: dict, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "summary.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True, default=str)
        handle.write("\n")
    return path


def read_summary(directory: str) -> dict:
    with open(os.path.join(directory, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)
