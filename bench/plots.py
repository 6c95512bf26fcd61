"""The seeds' two figures, from runs.csv files: epoch time per device count, and speedup
against ideal linear scaling. Simulated series are dashed and labelled "simulated";
oversubscribed measured points are drawn hollow; measured points whose machine was not quiet
(Note [A quiet machine] in bench/quiet.py) are crossed in red, on the speedup plot also those
whose 1-device baseline was not quiet. Beside a simulated series, the published points of the
same cluster (bench/validation/tarantella_published.toml) are drawn as grey diamonds with their
source. Several sweep directories overlay.
"""
from __future__ import annotations

import os

from bench import records
from bench.quiet import baseline_not_quiet
from bench.validation.published_curves import curves_for

__all__ = ["plot_directories", "series_of", "published_beside"]


def series_of(frame, directory: str):
    """[(label, simulated, rows sorted by devices)] per (model, framework, simulated, cluster)."""
    found = []
    keys = ["model", "framework", "simulated", "cluster"]
    frame = frame.astype({"cluster": object}).fillna({"cluster": ""})
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


def _not_quiet(rows, column):
    """The measured rows of `rows` whose figure in `column` a busy machine skewed."""
    if "quiet" not in rows:
        return rows.iloc[0:0]
    flagged = rows["quiet"].astype(str) == "False"
    if column == "speedup" and "speedup_baseline" in rows:
        flagged |= rows["speedup_baseline"].map(baseline_not_quiet).astype(bool)
    return rows[flagged & ~rows["simulated"].astype(bool)]


def _draw(axis, rows, column, label, simulated, color):
    style = "--" if simulated else "-"
    marker = "s" if simulated else "o"
    axis.plot(rows["devices"], rows[column], style, color=color, label=label, marker=marker)
    over = rows[rows["oversubscribed"].astype(bool)] if "oversubscribed" in rows else rows.iloc[0:0]
    if len(over):
        axis.plot(over["devices"], over[column], linestyle="none", marker="o", markersize=11,
                  markerfacecolor="white", markeredgecolor=color, label=f"{label}: oversubscribed")
    busy = _not_quiet(rows, column)
    if len(busy):
        axis.plot(busy["devices"], busy[column], linestyle="none", marker="x", markersize=12, color="red",
                  label=f"{label}: machine not quiet")


def published_beside(series, max_devices: int, column: str) -> list[tuple[str, list[int], list[float]]]:
    """(label, devices, values) of the published curves to draw beside the simulated series, up to
    max_devices: speedups, or minutes per epoch where the series' model is the published one."""
    found = {}
    for _, simulated, rows in series:
        if not simulated:
            continue
        model, cluster = str(rows["model"].iloc[0]), str(rows["cluster"].iloc[0])
        for curve in curves_for(model, cluster):
            if column == "epoch_time_min" and curve.model != model:
                continue
            values = curve.speedups if column == "speedup" else curve.minutes_per_epoch
            kept = [(d, v) for d, v in zip(curve.devices, values) if d <= max_devices]
            found[curve.label] = (curve.label, [d for d, _ in kept], [v for _, v in kept])
    return list(found.values())


def _draw_published(axis, series, counts, column):
    for label, devices, values in published_beside(series, max(counts), column):
        axis.plot(devices, values, ":", color="dimgray", marker="D", markersize=6, label=label)


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
    _draw_published(axis, series, counts, "epoch_time_min")
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
    _draw_published(axis, series, counts, "speedup")
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
