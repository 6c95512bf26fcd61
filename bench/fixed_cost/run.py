"""The driver of `python -m bench.fixed_cost` (see bench/fixed_cost/__init__.py): launches every
configuration through the launcher, interleaved and repeated, and writes runs.jsonl, summary.json
and summary.md."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.fixed_cost import report
from bench.machine import describe_machine, describe_source
from bench.programs.result_line import parse_result_line

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(REPO_ROOT, "bench", "fixed_cost", "rank_program.py")
DEFAULT_MODELS = ["mlp8x512:128", "mlp8x512:32", "digits_mlp:32", "resnet50_small:16"]
TRAIN_CONFIGS = (("keras", 1), ("tnt", 1), ("keras", 2), ("tnt", 2))
OPTIONAL_CONFIGS = (("tnt_metrics_after", 2),)
# Keras and tnt.Model alternating in one process per rank (rank_program.py, mode paired): the goals' figures
PAIRED_CONFIGS = (("paired", 1), ("paired", 2))
# Steps per launch: enough timed time per run (about a second or more) without making ResNet-50 slow.
DEFAULT_STEPS = {"resnet50_small": (6, 3)}
SMALL_MODEL_STEPS = (60, 10)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.fixed_cost", description=sys.modules["bench.fixed_cost"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, metavar="MODEL:MICRO_BATCH")
    parser.add_argument("--repeats", type=int, default=3, help="launches of each configuration, interleaved")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per launch (default: 60; ResNet-50 6)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: 10; ResNet-50 3")
    parser.add_argument("--repetitions", type=int, default=10, help="timed calls per collective figure")
    parser.add_argument("--pairs", type=int, default=4, help="paired launches: Keras and tnt fits, alternating")
    parser.add_argument("--configs", nargs="+", default=None, metavar="MODE:RANKS",
                        help="keep only these (from keras:1 tnt:1 keras:2 tnt:2 paired:1 paired:2 "
                             "tnt_metrics_after:2 collectives:2); default all but tnt_metrics_after:2")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "fixed_cost"))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    parser.add_argument("--summarize-only", action="store_true",
                        help="launch nothing: rewrite summary.json and summary.md in --out from its runs.jsonl "
                             "(after a change to the report), keeping the run's machine, source and settings")
    return parser.parse_args(argv)


def _model_list(specs) -> list[tuple[str, int]]:
    from bench.fixed_cost import models
    parsed = []
    for text in specs:
        name, _, micro = text.partition(":")
        models.get(name)  # fails clearly on an unknown name
        if not micro.isdigit() or int(micro) < 1:
            raise SystemExit(f"bench.fixed_cost: --models takes MODEL:MICRO_BATCH (e.g. mlp8x512:128), got {text!r}")
        parsed.append((name, int(micro)))
    return parsed


def _configs(wanted):
    every = TRAIN_CONFIGS + PAIRED_CONFIGS + OPTIONAL_CONFIGS + (("collectives", 2),)
    if not wanted:
        return TRAIN_CONFIGS + PAIRED_CONFIGS + (("collectives", 2),)
    known = {f"{mode}:{ranks}" for mode, ranks in every}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"bench.fixed_cost: unknown --configs {unknown}; choose from {sorted(known)}")
    return tuple((mode, ranks) for mode, ranks in every if f"{mode}:{ranks}" in wanted)


def _launch(program_args, ranks, args) -> dict:
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(ranks),
               "-x", "OMP_NUM_THREADS=1", "-x", "TF_NUM_INTRAOP_THREADS=1", "-x", "TF_NUM_INTEROP_THREADS=1",
               "--", PROGRAM, *program_args]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO_ROOT}
    started = time.time()
    load_before = round(os.getloadavg()[0], 2)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=REPO_ROOT)
    row = parse_result_line(done.stdout)
    if done.returncode != 0 or row is None:
        raise RuntimeError(f"bench.fixed_cost: {' '.join(program_args)} on {ranks} rank(s) failed "
                           f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    row.update(command=" ".join(command), started=started, seconds=round(time.time() - started, 1),
               load_average_1m_before=load_before, load_average_1m=round(os.getloadavg()[0], 2))
    return row


def _write_summary(out, rows, header) -> str:
    summary = {**header, **report.summarize(rows)}
    with open(os.path.join(out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    markdown = report.markdown(summary)
    with open(os.path.join(out, "summary.md"), "w") as handle:
        handle.write(markdown)
    return markdown


def _summarize_only(out) -> int:
    runs_path, summary_path = os.path.join(out, "runs.jsonl"), os.path.join(out, "summary.json")
    if not os.path.exists(runs_path) or not os.path.exists(summary_path):
        raise SystemExit(f"bench.fixed_cost: --summarize-only needs runs.jsonl and summary.json in {out}; "
                         "run the benchmark with --out there first")
    with open(runs_path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    with open(summary_path) as handle:
        earlier = json.load(handle)
    header = {key: earlier[key] for key in ("machine", "source", "models", "configs", "repeats", "seconds")
              if key in earlier}
    print(_write_summary(out, rows, header), flush=True)
    return 0


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.summarize_only:
        return _summarize_only(args.out)
    model_list = _model_list(args.models)
    configs = _configs(args.configs)
    os.makedirs(args.out, exist_ok=True)
    runs_path = os.path.join(args.out, "runs.jsonl")
    rows = []
    begun = time.time()
    with open(runs_path, "w") as runs:
        for repeat in range(args.repeats):
            for mode, ranks in configs:
                jobs = ([(list(dict.fromkeys(name for name, _ in model_list)), None)] if mode == "collectives"
                        else [([name], micro) for name, micro in model_list])
                for names, micro in jobs:
                    steps, warmup = DEFAULT_STEPS.get(names[0], SMALL_MODEL_STEPS)
                    program_args = ["--mode", mode, "--model", *names,
                                    "--steps", str(args.steps or steps),
                                    "--warmup-steps", str(args.warmup_steps or warmup),
                                    "--repetitions", str(args.repetitions)]
                    if micro is not None:
                        program_args += ["--micro-batch", str(micro)]
                    if mode == "paired":
                        program_args += ["--pairs", str(args.pairs)]
                    row = _launch(program_args, ranks, args)
                    row["repeat"] = repeat
                    rows.append(row)
                    runs.write(json.dumps(row, sort_keys=True) + "\n")
                    runs.flush()
                    print(report.one_line(row), flush=True)
    header = {"machine": describe_machine(), "source": describe_source(), "models": args.models,
              "configs": [f"{mode}:{ranks}" for mode, ranks in configs], "repeats": args.repeats,
              "seconds": round(time.time() - begun, 1)}
    print(_write_summary(args.out, rows, header), flush=True)
    print(f"bench.fixed_cost: {len(rows)} runs in {header['seconds']:.0f} s written to {args.out}", flush=True)
    return 0
