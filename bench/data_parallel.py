"""Data-parallel benchmark of tnt.Model on this machine, every configuration side by side
in one run (interleaved, repeated), written to results/data_parallel/.

    python -m bench.data_parallel [--models resnet50_small transformer_small] [--repeats 2]

Per model, with one compute thread per rank and the same micro-batch per rank (weak scaling):
  keras 1 rank              plain Keras 3 fit: the baseline
  tnt 1 and 2 ranks         tnt.Model, allreduce overlapped with backprop
  tnt_no_overlap 2 ranks    allreduce started only after the whole backprop
  tnt_local_bn 2 ranks      batch_norm="local": what BatchNormalization over the global batch costs
  tnt_rank_draws 2 ranks    random layers drawing per rank (before serial semantics): what serial draws cost
  mwms 1 and 2 ranks        tf.distribute.MultiWorkerMirroredStrategy, which needs Keras 2
                            (tf-keras): it does not run Keras 3 models. Install it with
                            `pip install --no-deps "tf-keras==2.21.*"` (its dependencies would
                            pull the full `tensorflow` package beside `tensorflow-cpu`)
Figures (summary.json): weak-scaling efficiency = step time at 1 rank / step time at 2
ranks (same micro-batch: 1.0 is perfect), for tnt, tnt_no_overlap and mwms; tnt's 1-rank
overhead = tnt 1-rank step time / keras step time - 1; the share of gradient allreduce
time overlapped with backprop and the exposed communication per step, from each tnt run's
timeline (Note [Overlap share] in tarantella/timeline/overlap.py; traces kept in <out>/timelines/,
open them in ui.perfetto.dev; --no-timeline leaves them out, and the overlap figures with them).
The overlap table (overlap.md, and "overlap_table" in summary.json), per model at 2 ranks: overlap
share, exposed communication and allreduce busy time per step, step time with overlap on and off.
A picture of one step of each model's first 2-rank tnt run: timeline_<model>.png (needs matplotlib;
the same as `python -m tarantella.timeline render TRACE OUT.png`).
Rows of runs.csv: one per run, with every step time, machine, commit and versions.
--configs keeps only some configurations (e.g. `--configs tnt:2 tnt_no_overlap:2` for the overlap table).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

import importlib.util

from bench.machine import describe_machine, describe_source

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO_ROOT, "bench", "programs", "data_parallel_modes.py")
CONFIGS = (("keras", 1), ("tnt", 1), ("tnt", 2), ("tnt_no_overlap", 2), ("tnt_local_bn", 2), ("tnt_rank_draws", 2),
           ("mwms", 1), ("mwms", 2))
TAG = "TNT_BENCH_RESULT "


def _timeline_path(model, mode, ranks, repeat, args) -> str | None:
    if args.no_timeline or not mode.startswith("tnt"):
        return None
    return os.path.join(args.out, "timelines", f"{model}_{mode}_x{ranks}_r{repeat}.json")


def _run(model, mode, ranks, args, repeat=0) -> dict:
    timeline = _timeline_path(model, mode, ranks, repeat, args)
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks),
               *(["--timeline", timeline] if timeline else []),
               "-x", "OMP_NUM_THREADS=1", "-x", "TF_NUM_INTRAOP_THREADS=1", "-x", "TF_NUM_INTEROP_THREADS=1",
               "--", PROGRAM, "--model", model, "--mode", mode, "--micro-batch", str(args.micro_batch[model]),
               "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO_ROOT}
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=REPO_ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith(TAG)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{model} {mode} x{ranks} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    row = json.loads(lines[-1][len(TAG):])
    if timeline and os.path.exists(timeline):
        from tarantella.timeline.overlap import overlap_from_trace, overlap_summary
        summary = overlap_summary(overlap_from_trace(timeline), skip_steps=args.warmup_steps)
        if summary:
            row["communication"] = dict(summary, timeline=os.path.relpath(timeline, args.out),
                                        **statistics_allreduces(timeline, args.warmup_steps))
    row.update(command=" ".join(command), started=started, load_average_1m=round(os.getloadavg()[0], 2))
    return row


def statistics_allreduces(trace_path: str, skip_steps: int) -> dict:
    """BatchNormalization's blocking statistics allreduces per step from a trace (their timeline spans, steps
    after warm-up, means over ranks and steps): how many, and the seconds from input to sum."""
    from tarantella.timeline import names, trace_file
    with open(trace_path) as handle:
        spans = trace_file.spans(json.load(handle), names.STATISTICS_ALLREDUCE)
    per_step: dict = {}
    for span in spans:
        if span["args"]["step"] >= skip_steps:
            count, seconds = per_step.get((span["pid"], span["args"]["step"]), (0, 0.0))
            per_step[(span["pid"], span["args"]["step"])] = (count + 1, seconds + span["dur"] * 1e-6)
    if not per_step:
        return {"statistics_allreduces_per_step": 0, "statistics_s_per_step": 0.0}
    return {"statistics_allreduces_per_step": statistics.mean(c for c, _ in per_step.values()),
            "statistics_s_per_step": statistics.mean(s for _, s in per_step.values())}


def _available_configs():
    """CONFIGS less the optional peer that is not installed, with a line saying how to install it."""
    if importlib.util.find_spec("tf_keras") is not None:
        return CONFIGS
    print('skipping the mwms rows: MultiWorkerMirroredStrategy needs Keras 2; install it with '
          '`pip install --no-deps "tf-keras==2.21.*"`', flush=True)
    return tuple((mode, ranks) for mode, ranks in CONFIGS if mode != "mwms")


def _median_step(rows, model, mode, ranks, best_run=False):
    """The median step time of all runs' steps pooled, or (best_run) of the run with the lowest median:
    on a machine shared with other work, the least disturbed run is the better estimate."""
    runs = [row["step_times_s"] for row in rows if (row["model"], row["mode"], row["ranks"]) == (model, mode, ranks)]
    if not runs:
        return None
    if best_run:
        return min(statistics.median(times) for times in runs)
    return statistics.median([t for times in runs for t in times])


def summarize(rows, models) -> dict:
    return {"pooled_median": _figures(rows, models, best_run=False),
            "best_run_median": _figures(rows, models, best_run=True)}


def _figures(rows, models, best_run) -> dict:
    figures = {}
    for model in models:
        step = {f"{mode}_x{ranks}": _median_step(rows, model, mode, ranks, best_run) for mode, ranks in CONFIGS}
        hidden = [row["communication"]["overlap_share"] for row in rows
                  if row["model"] == model and row["mode"] == "tnt" and row["ranks"] == 2 and "communication" in row]
        hidden_no_overlap = [row["communication"]["overlap_share"] for row in rows if row["model"] == model
                             and row["mode"] == "tnt_no_overlap" and "communication" in row]
        exposed = [row["communication"]["exposed_s"] for row in rows
                   if row["model"] == model and row["mode"] == "tnt" and row["ranks"] == 2 and "communication" in row]
        ratio = lambda a, b: (step[a] / step[b]) if step.get(a) and step.get(b) else None  # noqa: E731
        figures[model] = {
            "median_step_time_s": step,
            "weak_scaling_efficiency_tnt": ratio("tnt_x1", "tnt_x2"),
            "weak_scaling_efficiency_tnt_no_overlap": ratio("tnt_x1", "tnt_no_overlap_x2"),
            "weak_scaling_efficiency_mwms_keras2": ratio("mwms_x1", "mwms_x2"),
            "one_rank_overhead_vs_keras": (ratio("tnt_x1", "keras_x1") - 1) if ratio("tnt_x1", "keras_x1") else None,
            "allreduce_overlap_share": statistics.mean(hidden) if hidden else None,
            "allreduce_overlap_share_no_overlap": statistics.mean(hidden_no_overlap) if hidden_no_overlap else None,
            "allreduce_exposed_s": statistics.mean(exposed) if exposed else None,
        }
    return figures


def overlap_table(rows, models, ranks=2) -> dict:
    """Per model at `ranks`: the timeline's overlap share, exposed communication and allreduce busy time
    per step (means over runs, steps after warm-up, ranks) and the median step time, overlap on and off."""
    table = {}
    for model in models:
        entry = {}
        for mode, label in (("tnt", "overlap_on"), ("tnt_no_overlap", "overlap_off")):
            runs = [row for row in rows if (row["model"], row["mode"], row["ranks"]) == (model, mode, ranks)]
            measured = [row["communication"] for row in runs if row.get("communication")]
            mean = lambda key: statistics.mean(c[key] for c in measured) if measured else None  # noqa: E731
            entry[label] = {"runs": len(runs), "median_step_time_s": _median_step(rows, model, mode, ranks),
                            "overlap_share": mean("overlap_share"), "exposed_communication_s": mean("exposed_s"),
                            "allreduce_busy_s": mean("communication_s")}
        table[model] = entry
    return table


def overlap_markdown(table, ranks=2) -> str:
    def cell(value, unit=""):
        if value is None:
            return "-"
        return f"{value:.0%}" if unit == "%" else f"{value * 1e3:.1f} ms"

    lines = [f"Overlap of the gradient allreduce with backprop at {ranks} ranks (Note [Overlap share] in "
             "tarantella/timeline/overlap.py: share of allreduce busy time before the last gradient, per step)", "",
             "| model | overlap | overlap share | exposed communication / step | allreduce busy / step "
             "| step time (median) |", "|---|---|---|---|---|---|"]
    for model, entry in table.items():
        for label in ("overlap_on", "overlap_off"):
            figures = entry[label]
            lines.append(f"| {model} | {label.split('_')[1]} | {cell(figures['overlap_share'], '%')} | "
                         f"{cell(figures['exposed_communication_s'])} | {cell(figures['allreduce_busy_s'])} | "
                         f"{cell(figures['median_step_time_s'])} |")
    return "\n".join(lines) + "\n"


def render_pictures(rows, models, out) -> list[str]:
    """timeline_<model>.png: a step of the model's first 2-rank tnt run with a timeline."""
    from tarantella.timeline.render import RenderError, render_step
    written = []
    for model in models:
        run = next((row for row in rows if (row["model"], row["mode"], row["ranks"]) == (model, "tnt", 2)
                    and (row.get("communication") or {}).get("timeline")), None)
        if run is None:
            continue
        target = os.path.join(out, f"timeline_{model}.png")
        try:
            step = render_step(os.path.join(out, run["communication"]["timeline"]), target)
        except (RenderError, OSError) as error:
            print(f"{model}: no timeline picture: {error}", flush=True)
            continue
        print(f"{model}: step {step} of {run['communication']['timeline']} drawn into {target}", flush=True)
        written.append(target)
    return written


def _selected(configs, wanted):
    """configs restricted to `wanted` ("mode:ranks" strings; None keeps all); unknown names fail clearly."""
    if not wanted:
        return configs
    known = {f"{mode}:{ranks}" for mode, ranks in CONFIGS}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"bench.data_parallel: unknown --configs {unknown}; choose from {sorted(known)}")
    return tuple((mode, ranks) for mode, ranks in configs if f"{mode}:{ranks}" in wanted)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data_parallel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50_small", "transformer_small"])
    parser.add_argument("--micro-batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "data_parallel"))
    parser.add_argument("--summarize-only", action="store_true", help="recompute summary.json from runs.csv")
    parser.add_argument("--no-timeline", action="store_true",
                        help="record no timelines (and so no overlap figures) for the tnt runs")
    parser.add_argument("--configs", nargs="+", metavar="MODE:RANKS",
                        help="only these configurations, e.g. tnt:2 tnt_no_overlap:2 (default: all)")
    args = parser.parse_args(argv)
    args.micro_batch = {model: args.micro_batch for model in args.models}
    os.makedirs(args.out, exist_ok=True)
    rows = _read_runs(args.out) if args.summarize_only else []
    configs = _selected(_available_configs(), args.configs)
    for repeat in range(0 if args.summarize_only else args.repeats):
        for model in args.models:
            for mode, ranks in configs:
                try:
                    row = _run(model, mode, ranks, args, repeat)
                except (RuntimeError, subprocess.TimeoutExpired) as failure:
                    # One configuration failing must not throw away the rows measured so far.
                    print(f"{model} {mode} x{ranks}: not measured: {str(failure).splitlines()[0]}", flush=True)
                    continue
                row["repeat"] = repeat
                rows.append(row)
                print(f"{model:18} {mode:15} x{ranks}  median step {statistics.median(row['step_times_s']):.3f} s"
                      + (f"  overlap share {row['communication']['overlap_share']:.0%}" if "communication" in row else ""),
                      flush=True)
    context = {"machine": describe_machine(), "source": describe_source(), "python": sys.version.split()[0]}
    if args.summarize_only:
        context["machine"], context["source"] = rows[0]["machine"], rows[0]["source"]
    else:
        _write_runs(rows, context, args.out)
    summary = {"options": {k: v for k, v in vars(args).items()}, **context,
               "note": "mwms runs under Keras 2 (tf-keras): MultiWorkerMirroredStrategy does not support Keras 3",
               "load_average_1m_during_runs": [row["load_average_1m"] for row in rows],
               "figures": summarize(rows, args.models), "overlap_table": overlap_table(rows, args.models)}
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    table = overlap_markdown(summary["overlap_table"])
    with open(os.path.join(args.out, "overlap.md"), "w") as handle:
        handle.write(table)
    print(json.dumps(summary["figures"], indent=2))
    print(table)
    render_pictures(rows, args.models, args.out)
    return 0


COLUMNS = ["model", "mode", "ranks", "repeat", "micro_batch", "global_batch", "threads_per_rank", "parameters",
           "steps", "warmup_steps", "step_times_s", "communication", "versions", "load_average_1m", "started",
           "command"]


def _write_runs(rows, context, directory):
    with open(os.path.join(directory, "runs.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS + ["machine", "source"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**{c: json.dumps(row.get(c)) if isinstance(row.get(c), (list, dict)) else row.get(c)
                                for c in COLUMNS},
                             "machine": json.dumps(context["machine"]), "source": json.dumps(context["source"])})


def _read_runs(directory):
    rows = []
    with open(os.path.join(directory, "runs.csv"), newline="") as handle:
        for record in csv.DictReader(handle):
            row = {}
            for key, value in record.items():
                try:
                    row[key] = json.loads(value) if value != "" else None
                except (json.JSONDecodeError, TypeError):
                    row[key] = value
            rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
