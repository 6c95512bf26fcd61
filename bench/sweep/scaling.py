"""A scaling sweep end to end: run or simulate each device count, then write and plot.

Measured sweeps run the 1-device point first and measure the model's profile there
(profile.json), so any sweep directory can later seed a simulation. Counts the machine
(or hostfile) cannot run are simulated on --cluster (default DEFAULT_CLUSTER), as is
the whole sweep with --simulate: one runs.csv and one plot hold the measured points
and the simulated series, each marked. Speedups are always against a 1-device figure
of the same series: measured if it ran (a sweep without 1 measures it anyway, for the
profile), simulated on the same cluster otherwise. Given --cluster and counts that all
run here, a measured sweep also predicts its own counts on that cluster and writes
validation.csv (`tnt-bench validate` does it out of sample).
"""
from __future__ import annotations

import datetime
import os
import shutil
import sys

from bench import records
from bench.data.datasets import get_dataset_info
from bench.errors import BenchUsageError
from bench.machine import describe_machine, describe_software, describe_source
from bench.models.registry import get_model_entry
from bench.quiet import unquiet_baseline
from bench.simulate.cluster_profile import load_cluster_profile, shipped_profile_names
from bench.simulate.model_profile import load_profile
from bench.simulate.predict_sweep import check_cluster_capacity, simulated_row
from bench.sweep.capacity import find_capacity, is_oversubscribed, split_counts
from bench.sweep.options import SweepOptions
from bench.sweep.progress import Progress
from bench.sweep.rank_loss import check_rank_loss, rank_loss_count, run_rank_loss
from bench.sweep.runner import measured_row, run_point
from bench.validation.published_curves import curves_for
from bench.validation.record import validation_points, write_validation

# Where counts beyond the machine are simulated when --cluster is not given: a CPU cluster,
# so the simulated ranks compute like the measured ones (per core, Note [Compute of a
# simulated rank]), and the extension continues the measured story.
DEFAULT_CLUSTER = "supermuc_ng"

__all__ = ["DEFAULT_CLUSTER", "run_scaling", "check_batches", "complete_row", "simulate_rows", "summary_points",
           "flag_unquiet_baselines"]


def check_batches(options: SweepOptions, default_micro_batch: int) -> None:
    if options.global_batch:
        uneven = [c for c in options.counts if options.global_batch % c]
        if uneven:
            raise BenchUsageError(f"--global-batch {options.global_batch} cannot be split evenly over "
                                  f"{', '.join(map(str, uneven))} devices; choose a multiple of every count")
    for count in options.counts:
        if options.micro_batch_for(count, default_micro_batch) < 1:
            raise BenchUsageError(f"--global-batch {options.global_batch} leaves no example per device "
                                  f"at {count} devices")


def _epoch_examples(options: SweepOptions, entry) -> int:
    name = options.data.split(":", 1)[1] if options.data.startswith("tfds:") else entry.dataset
    return get_dataset_info(name).train_examples


def complete_row(row: dict, options: SweepOptions, entry, epoch_examples: int, common: dict) -> dict:
    for key, value in common.items():
        row.setdefault(key, value)
    row.setdefault("data", options.data)
    row.setdefault("input_sharding", options.input_sharding if options.data != "synthetic" else "")
    row.setdefault("warmup_steps", 0 if row["simulated"] else options.warmup_steps)
    row.setdefault("steps", 0 if row["simulated"] else options.steps)
    examples_per_s = row["global_batch"] / row["step_time_median_s"]
    row["throughput"] = examples_per_s * entry.units_per_example
    row["throughput_unit"] = f"{entry.sample_unit}/s"
    row["epoch_examples"] = epoch_examples
    row["epoch_time_s"] = epoch_examples / examples_per_s
    row["epoch_time_min"] = row["epoch_time_s"] / 60.0
    return row


def _measure(options, entry, progress, profile_path, counts, capacity):
    """Measured rows of `counts`, and the 1-device row (measured for the profile even
    when 1 is not among the counts; then it is returned apart, as the speedup baseline)."""
    rows, baseline = [], None
    if 1 not in counts:
        progress.start(1, "measuring the 1-device profile and baseline")
        result = run_point(options, 1, options.micro_batch_for(1, entry.default_micro_batch), profile_path,
                           on_step=lambda line: progress.step(1, line))
        baseline = measured_row(result, False)
        progress.finish(1, f"profile written to {profile_path}")
    for count in counts:
        progress.start(count)
        micro = options.micro_batch_for(count, entry.default_micro_batch)
        result = run_point(options, count, micro, profile_path if count == 1 else None,
                           on_step=lambda line, count=count: progress.step(count, line))
        row = measured_row(result, is_oversubscribed(count, capacity))
        rows.append(row)
        progress.finish(count, f"median step {row['step_time_median_s']:.3f} s"
                               + (" (oversubscribed)" if row["oversubscribed"] else ""))
    return rows, baseline


def _profile_for_simulation(options, entry, progress, profile_path):
    if options.model_profile:
        profile = load_profile(options.model_profile)
        if profile["model"] != entry.name:
            raise BenchUsageError(f"--model-profile {options.model_profile} is of model "
                                  f"{profile['model']!r}, not {entry.name!r}")
        shutil.copyfile(options.model_profile, profile_path)
        return profile
    progress.start(1, "measuring the 1-device profile")
    run_point(options, 1, options.micro_batch_for(1, entry.default_micro_batch), profile_path)
    progress.finish(1, f"profile written to {profile_path}")
    return load_profile(profile_path)


def simulate_rows(options, entry, profile, cluster, counts):
    rows = []
    for count in counts:
        # The keras baseline exchanges no gradients, so its prediction has no communication.
        row = simulated_row(profile, cluster, count, options.micro_batch_for(count, entry.default_micro_batch),
                            exchange_gradients=options.framework == "tnt", real_data=options.data != "synthetic",
                            precision=options.precision,
                            shard_after_decode=options.input_sharding == "after-decode")
        row["command"] = options.command
        rows.append(row)
    return rows


def _note_profile_batch(profile: dict, options, entry, counts, cluster) -> None:
    """A simulation scales the profile's step linearly in the micro-batch, but a step's cost per example changes
    with the batch: ResNet-50 here costs 0.92 core-seconds per image at 8 and 0.35 at 64 (results/validation/
    README.md). Say so where the simulated micro-batches are more than 2x from the profile's, unless the cluster
    publishes the model's throughput (Note [Compute of a simulated rank]: then the profile times nothing)."""
    if profile["model"] in cluster.model_steps:
        return
    measured = profile["micro_batch"]
    micro_batches = {options.micro_batch_for(count, entry.default_micro_batch) for count in counts}
    far = sorted(m for m in micro_batches if max(m, measured) > 2 * min(m, measured))
    if far:
        print(f"tnt-bench: note: the model profile was measured at micro-batch {measured} and the simulation runs "
              f"micro-batch {', '.join(map(str, far))}; a step's cost per example changes with the batch (ResNet-50 "
              f"here: 0.92 core-s per image at 8, 0.35 at 64), so measure the profile at the micro-batch you "
              f"simulate", file=sys.stderr)


def summary_points(rows: list[dict]) -> list[dict]:
    return [{key: row.get(key) for key in (
        "devices", "nodes", "simulated", "cluster", "oversubscribed", "micro_batch", "global_batch",
        "step_time_median_s", "throughput", "throughput_unit", "epoch_time_min", "speedup",
        "efficiency", "speedup_baseline", "quiet", "not_quiet_because", "input_share", "bound_by")} for row in rows]


def flag_unquiet_baselines(rows: list[dict], measured_baseline: dict | None) -> None:
    """Append to a measured speedup's baseline label that its 1-device run was not quiet (Note [A quiet
    machine] in bench/quiet.py): such a speedup is off even when its own run was quiet."""
    one = next((row for row in rows if row["devices"] == 1 and not row["simulated"]), measured_baseline)
    if one is None or one.get("quiet", True):
        return
    for row in rows:   # not the 1-device run itself: its own NOT QUIET says it
        if not row["simulated"] and row is not one and row["speedup_baseline"].startswith("measured"):
            row["speedup_baseline"] = unquiet_baseline(row["speedup_baseline"], one["not_quiet_because"])


def _baselines(rows, measured_baseline, simulated_series, options, entry, epoch_examples, common):
    """1-device figures for the series whose counts lack 1 (see records.derive_figures)."""
    baselines = {}
    if measured_baseline is not None:
        row = complete_row(dict(measured_baseline), options, entry, epoch_examples, common)
        baselines[records.kind_of(row)] = (row["epoch_time_s"], "measured 1 device (profile run)")
    for profile, cluster in simulated_series:
        row = complete_row(simulate_rows(options, entry, profile, cluster, [1])[0], options, entry,
                           epoch_examples, common)
        baselines.setdefault(records.kind_of(row), (row["epoch_time_s"], f"simulated 1 device on {cluster.name}"))
    return baselines


def run_scaling(options: SweepOptions) -> dict:
    """Run and/or simulate the sweep and write runs.csv, summary.json, profile.json, plots."""
    entry = get_model_entry(options.model)
    check_batches(options, entry.default_micro_batch)
    check_rank_loss(options)
    epoch_examples = _epoch_examples(options, entry)
    if options.simulate and not options.cluster:
        raise BenchUsageError("--simulate needs --cluster PROFILE (a TOML file, or one of "
                              f"{', '.join(shipped_profile_names())})")
    measure, beyond = [], list(options.counts)
    capacity = None
    if not options.simulate:
        capacity = find_capacity(options.hostfile, options.npernode)
        measure, beyond = split_counts(options.counts, capacity, options.oversubscribe)
    loss_count = rank_loss_count(measure) if options.kill_rank_at else None
    cluster_name = options.cluster or (DEFAULT_CLUSTER if beyond else None)
    cluster = load_cluster_profile(cluster_name) if cluster_name else None
    if cluster is not None:
        cluster.speed_at(options.precision)  # a profile that states no speed at it: an error before any run
    if beyond:
        check_cluster_capacity(beyond, cluster)
    os.makedirs(options.out, exist_ok=True)
    profile_path = os.path.join(options.out, "profile.json")
    machine, source = describe_machine(), describe_source()
    runs = (len(measure) + (0 if 1 in measure or (options.simulate and options.model_profile) else 1)
            + (1 if loss_count else 0))
    progress = Progress(max(runs, 1), f"{options.model} ({options.framework})", enabled=options.progress)

    measured_baseline, simulated_series, rank_loss = None, [], None
    if options.simulate:
        profile = _profile_for_simulation(options, entry, progress, profile_path)
        _note_profile_batch(profile, options, entry, options.counts, cluster)
        rows = simulate_rows(options, entry, profile, cluster, options.counts)
        simulated_series.append((profile, cluster))
    else:
        rows, measured_baseline = _measure(options, entry, progress, profile_path, measure, capacity)
        if loss_count:
            progress.start(loss_count, f"again under --elastic, rank {loss_count - 1} killed after step "
                                       f"{options.kill_rank_at}")
            micro = options.micro_batch_for(loss_count, entry.default_micro_batch)
            rank_loss = run_rank_loss(options, loss_count, micro, next(r for r in rows if r["devices"] == loss_count),
                                      on_step=lambda line: progress.step(loss_count, line))
            progress.finish(loss_count, f"went on with {rank_loss['devices_after']} after "
                                        f"{rank_loss['recovery_s']:.1f} s")
        if cluster is not None:
            # Beyond the machine: the whole series on the cluster, so its speedups have
            # their own 1-device figure; else the measured counts, for validation.
            profile = load_profile(profile_path)
            simulated = options.counts if beyond else measure
            _note_profile_batch(profile, options, entry, simulated, cluster)
            rows += simulate_rows(options, entry, profile, cluster, simulated)
            simulated_series.append((profile, cluster))

    sweep = os.path.basename(os.path.normpath(options.out))
    timestamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    common = {"sweep": sweep, "model": entry.name, "framework": options.framework, "precision": options.precision,
              "scaling": options.scaling, "timestamp": timestamp, **machine, **source,
              **describe_software()}
    rows = [complete_row(row, options, entry, epoch_examples, common) for row in rows]
    records.derive_figures(rows, _baselines(rows, measured_baseline, simulated_series, options, entry,
                                            epoch_examples, common))
    flag_unquiet_baselines(rows, measured_baseline)
    records.write_runs(rows, options.out)
    validation = [] if beyond or cluster is None else validation_points(
        [r for r in rows if not r["simulated"]], [r for r in rows if r["simulated"]])
    if validation:
        write_validation(options.out, validation, cluster, options.command, {"model": entry.name})
    summary = {
        "sweep": sweep, "created": timestamp, "command": options.command,
        "options": {k: v for k, v in vars(options).items() if k not in ("command",)},
        "model": {"name": entry.name, "description": entry.description, "unit": entry.sample_unit,
                  "dataset": entry.dataset, "epoch_examples": epoch_examples},
        "machine": machine, "source": source,
        "measured_counts": measure, "simulated_counts": sorted({r["devices"] for r in rows if r["simulated"]}),
        "cluster": None if cluster is None else cluster.describe(),
        "points": summary_points(rows),
        "validation": validation,
        "rank_loss": rank_loss,   # --kill-rank-at (bench/sweep/rank_loss.py)
        # published measurements of the simulated cluster, drawn and printed beside the simulation
        "published": [] if cluster is None or not any(r["simulated"] for r in rows)
        else [curve.describe() for curve in curves_for(entry.name, cluster.name)],
        "files": ["runs.csv", "summary.json", "profile.json"] + (["validation.csv", "validation.json"]
                                                                 if validation else []),
    }
    if options.plots:
        from bench.plots import plot_directories
        summary["files"] += [os.path.basename(p) for p in plot_directories([options.out], options.out)]
    records.write_summary(summary, options.out)
    return summary
