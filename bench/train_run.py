"""`tnt-bench train`: run a benchmark to its quality target through the launcher.

Writes into --out (default results/train_<benchmark>): mllog.log (the `:::MLLOG` lines)
and result.json (time to target, evaluations, options, machine, source). Exit code 0
when the target was reached, 1 when not (or the run failed), 2 for bad input.
"""
from __future__ import annotations

import datetime
import json
import os
import sys

from bench.errors import BenchUsageError
from bench.launched_run import LaunchTimedOut, run_launched
from bench.machine import describe_machine, describe_source
from bench.programs.result_line import parse_result_line
from bench.specs import load_spec

__all__ = ["run_training", "TrainingRunError"]

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "train_to_target.py")


class TrainingRunError(RuntimeError):
    """The training run failed; the message holds its exit code and last output."""


def run_training(args, command_line: str) -> int:
    spec = load_spec(args.benchmark)
    if args.framework == "keras" and args.devices > 1:
        raise BenchUsageError("--framework keras trains one independent model per rank; time to "
                              "accuracy needs --framework tnt with more than 1 device")
    out = args.out or os.path.join("results", f"train_{spec['name']}")
    os.makedirs(out, exist_ok=True)
    mllog_path = os.path.join(out, "mllog.log")
    if os.path.exists(mllog_path):
        os.remove(mllog_path)
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(args.devices), "-x",
               "TF_CPP_MIN_LOG_LEVEL=2", "--", PROGRAM, "--benchmark", spec["name"], "--framework",
               args.framework, "--seed", str(args.seed), "--mllog", os.path.abspath(mllog_path)]
    for flag, value in (("--global-batch", args.global_batch), ("--max-epochs", args.max_epochs),
                        ("--data-dir", args.data_dir)):
        if value:
            command += [flag, str(value)]
    try:
        process = run_launched(command, args.timeout)
    except LaunchTimedOut:
        raise TrainingRunError(f"training {spec['name']} took longer than {args.timeout:.0f} s; "
                               f"raise --timeout") from None
    stdout, stderr = process.stdout, process.stderr
    last = "\n".join(stderr.strip().splitlines()[-10:])
    if process.returncode in (2, 3):
        said = [line.split("train_to_target: ", 1)[1] for line in stderr.splitlines()
                if "train_to_target: " in line]
        raise BenchUsageError(said[-1] if said else f"the training program exited with {process.returncode}")
    result = parse_result_line(stdout)
    if process.returncode or result is None:
        raise TrainingRunError(f"training {spec['name']} failed with exit code {process.returncode}:\n{last}")
    record = {"result": result, "spec": spec, "command": command_line, "launch": " ".join(command),
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": describe_machine(), "source": describe_source()}
    with open(os.path.join(out, "result.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    quality = result["evaluations"][-1]["quality"] if result["evaluations"] else float("nan")
    if result["reached"]:
        print(f"tnt-bench: {spec['name']} reached {spec['quality_metric']} {quality:.4f} >= "
              f"{spec['quality_target']} after {result['epochs']} epoch(s): time to target "
              f"{result['time_to_target_s']:.1f} s on {result['ranks']} device(s); wrote {out}/result.json, "
              f"{out}/mllog.log")
        return 0
    print(f"tnt-bench: {spec['name']} did not reach {spec['quality_metric']} {spec['quality_target']} "
          f"in {result['epochs']} epoch(s) (last {quality:.4f}); wrote {out}/result.json", file=sys.stderr)
    return 1
