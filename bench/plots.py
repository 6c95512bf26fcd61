"""The seeds' two figures, from runs.csv files: epoch time per device count, and speedup
against ideal linear scaling. Simulated series are dashed and labelled "simulated";
oversubscribed measured points are drawn hollow. Several sweep directories overlay.
"""
from __future__ import annotations

import os

from bench import records

__all__ = ["plot_directories", "series_of"]


def series_of(frame, directory: str):
    """[(label, simulated, rows sorted by devices)] per (model, framework, simulated, cluster)."""
    found = []
    keys = ["model", "framework", "simulated", "cluster"]
    frame = frame.fillna({"cluster": ""})
    for (model, framework, simulated, cluster), rows in frame.groupby(keys, sort=False):
        simulated = bool(simulated)
        label = f"{model} ({framework}"
        label += f", simulated: {cluster})" if simulated else ", measured)"
        sweep = os.path.basename(os.path.normpath(directory))
        found.append((f"{sweep}: {label}", simulated, rows.sort_values("devices")))
    return found


def _axes_log2(axis, counts):
    axis.set_xscale("log", base=2)
    axis.set_xticks(counts)
    axis.set_xticklabels([str(c) for c in counts], fontsize=8)
    axis.grid(True, which="both", alpha=0.3)


def _draw(axis, rows, column, label, simulated, color):
    style = "--" if simulated else "-"
    marker = "s" if simulated else "o"
    axis.plot(rows["devices"], rows[column], style, color=color, label=label, marker=marker)
    over = rows[rows["oversubscribed"].astype(bool)] if "oversubscribed" in rows else rows.iloc[0:0]
    if len(over):
        axis.plot(over["devices"], over[column], linestyle="none", marker="o", markersize=11,
                  markerfacecolor="white", markeredgecolor=color, label=f"{label}: oversubscribed")


def plot_directories(directories: list[str], out_dir: str, title: str | None = None) -> list[str]:
    """Write epoch_time.{png,svg} and speedup.{png,svg} into out_dir; return their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    series = []
    for directory in directories:
        series += series_of(records.read_runs(directory), directory)
    counts = sorted({int(c) for _, _, rows in series for c in rows["devices"]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    models = sorted({str(rows["model"].iloc[0]) for _, _, rows in series})
    title = title or ", ".join(models)
    os.makedirs(out_dir, exist_ok=True)
    written = []

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, (label, simulated, rows) in enumerate(series):
        _draw(axis, rows, "epoch_time_min", label, simulated, colors[index % len(colors)])
    axis.set_yscale("log")
    _axes_log2(axis, counts)
    axis.set_xlabel("devices")
    axis.set_ylabel("minutes per epoch")
    axis.set_title(f"Time per epoch: {title}")
    axis.legend(fontsize=7)
    figure.tight_layout()
    written += _save(figure, out_dir, "epoch_time")
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(counts, counts, ":", color="black", label="ideal (linear)")
    for index, (label, simulated, rows) in enumerate(series):
        _draw(axis, rows, "speedup", label, simulated, colors[index % len(colors)])
    _axes_log2(axis, counts)
    axis.set_yscale("log", base=2)
    axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axis.set_xlabel("devices")
    axis.set_ylabel("speedup over 1 device")
    axis.set_title(f"Speedup: {title}")
    axis.legend(fontsize=7)
    figure.tight_layout()
    written += _save(figure, out_dir, "speedup")
    plt.close(figure)
    return written


def _save(figure, out_dir, name):
    paths = []
    for extension in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{extension}")
        figure.savefig(path, dpi=120)
        paths.append(path)
    return paths
