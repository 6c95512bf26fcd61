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

__all__ = ["RUN_COLUMNS", "derive_figures", "kind_of", "write_runs", "read_runs", "write_summary",
           "read_summary", "write_measurement"]

RUN_COLUMNS = [
    "sweep", "model", "framework", "devices", "nodes", "devices_per_node", "simulated",
    "cluster", "oversubscribed", "micro_batch", "global_batch", "scaling", "data", "input_sharding",
    "precision",
    "warmup_steps", "steps", "step_time_median_s", "step_time_mean_s", "step_time_min_s",
    "step_time_max_s", "step_time_std_s", "step_times_s", "throughput", "throughput_unit",
    "epoch_examples", "epoch_time_s", "epoch_time_min", "speedup", "efficiency", "speedup_baseline",
    "threads_per_rank", "parameters", "final_loss", "timestamp", "hostname", "cpu_model",
    "cpus", "physical_cores", "memory_gib", "os", "load_average_1m", "quiet", "not_quiet_because",
    "input_alone_s", "input_share", "bound_by", "git_commit", "git_dirty", "python",
    "tensorflow", "keras", "tarantella", "numpy", "mpi", "command",
]


def derive_figures(rows: list[dict], baselines: dict | None = None) -> list[dict]:
    """Fill speedup, efficiency and speedup_baseline, per (model, framework, simulated, cluster).

    Speedup is a 1-device epoch time over this row's: the kind's own 1-device row, else
    `baselines[kind(row)] = (epoch_time_s, label)` (a 1-device figure measured by the
    profile run or simulated on the same cluster); a kind with neither gets NaN.
    """
    found = dict(baselines or {})
    for row in rows:
        if row["devices"] == 1:
            found[_kind(row)] = (row["epoch_time_s"], "simulated 1 device" if row["simulated"]
                                 else "measured 1 device")
    for row in rows:
        base, label = found.get(_kind(row), (None, ""))
        row["speedup"] = base / row["epoch_time_s"] if base else float("nan")
        row["efficiency"] = row["speedup"] / row["devices"] if base else float("nan")
        row["speedup_baseline"] = label
    return rows


def kind_of(row: dict) -> tuple:
    """The series a row belongs to: (model, framework, simulated, cluster)."""
    return _kind(row)


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


def write_raw_and_table(directory: str, raw: list[dict], context: dict, table: str, preface: str = "") -> None:
    """runs.jsonl (one raw result per line) and table.md (machine and source first, then `preface`, then `table`),
    as the side-by-side benchmarks (bench/pipeline/defaults.py, bench/sharding/memory.py) write them."""
    with open(os.path.join(directory, "runs.jsonl"), "w") as handle:
        for result in raw:
            handle.write(json.dumps(result) + "\n")
    with open(os.path.join(directory, "table.md"), "w") as handle:
        handle.write(f"Machine: {json.dumps(context['machine'])}\nSource: {json.dumps(context['source'])}\n\n")
        handle.write(preface)
        handle.write(table)


def write_measurement(directory: str, name: str, record: dict) -> str:
    """DIRECTORY/NAME: a measuring tool's `record` with the machine, versions and commit it ran on."""
    from tarantella._provenance import describe_machine, describe_software, describe_source
    record = dict(record, machine=describe_machine(), software=describe_software(), source=describe_source())
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        json.dump(record, handle, indent=2)
    print(f"wrote {path}")
    return path


def read_summary(directory: str) -> dict:
    with open(os.path.join(directory, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)
