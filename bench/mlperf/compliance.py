"""Run MLCommons' compliance checker (mlperf_logging, training rules 5.0.0) on a benchmark log.

    python -m bench.mlperf.compliance results/bench/train_mini_digits_1dev/mllog.log

Note [Which rules check our logs]
`python -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 LOG` runs the
ruleset's common.yaml; the log's submission_division then queues {division}_common.yaml, whose
submission_benchmark rule admits only MLPerf 5.0's own benchmarks and queues that benchmark's
file ({division}_{benchmark}.yaml). Our benchmarks (mini_digits, resnet50, transformer) are not
among them, so the command itself stops (no such file) on any log of ours, however well formed.
This module runs the same checker class on the same parsed lines with the same queue of rule
files, unchanged, and substitutes one file only: for a benchmark MLPerf 5.0 has no file for,
benchmarks.yaml, whose submission_benchmark rule admits our benchmarks (overriding the division's
list, as a benchmark file does in MLPerf's own chain). Every common rule of 5.0.0 applies as
written (cache_clear, init_start/init_stop and its time limit, run_start/run_stop, epoch and eval
records, train_samples, eval_samples, eval_accuracy). A second checker of the same class runs
tnt_rules.yaml alone (alone, so that it overrides none of the chain's messages): the rules a CPU
run here can keep besides: the seed logged, the evaluation cadence of the spec, the quality
target logged and reached exactly when the run says success. bench/README.md lists the MLPerf
rules a run here cannot meet.
"""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["RULESET", "BENCHMARK_RULES", "PROJECT_RULES", "check_log", "main"]

RULESET = "5.0.0"
_HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK_RULES = os.path.join(_HERE, "benchmarks.yaml")
PROJECT_RULES = os.path.join(_HERE, "tnt_rules.yaml")


def check_log(path: str) -> list[str]:
    """The checker's messages for the log at `path`; [] when it complies."""
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

    rules_root = os.path.dirname(os.path.abspath(mlp_compliance.__file__))
    checker = mlp_compliance.make_checker("training", RULESET, quiet=False, werror=False)
    loglines, errors = mlp_parser.parse_file(path, ruleset=RULESET)
    messages = [f"cannot parse: {line} ({error})" for line, error in errors]
    if not loglines:
        messages.append("no :::MLLOG lines")
    queue = mlp_compliance.enqueued_configs   # the checker's own queue, filled by the rule files
    queue.clear()
    queue.append(f"training_{RULESET}/common.yaml")
    while queue:
        rules = os.path.join(rules_root, queue.pop(0))
        if not os.path.exists(rules):   # a benchmark file MLPerf has not: ours (Note [Which rules check our logs])
            rules = BENCHMARK_RULES
        checker.configured_checks(loglines, rules)
    ours = mlp_compliance.make_checker("training", RULESET, quiet=False, werror=False)
    ours.configured_checks(loglines, PROJECT_RULES)
    queue.clear()
    return messages + [message for one in (checker, ours)
                       for message in [*one.overwritable.values(), *one.not_overwritable]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mlperf.compliance", description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="mllog.log files")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.logs:
        if not os.path.isfile(path):
            print(f"{path}: error: no such file", file=sys.stderr)
            return 2
        messages = check_log(path)
        failed += bool(messages)
        print(f"{path}: {'REJECTED' if messages else 'compliant'} (MLPerf training rules {RULESET}, "
              f"bench/mlperf/{os.path.basename(BENCHMARK_RULES)}, bench/mlperf/{os.path.basename(PROJECT_RULES)})")
        for message in messages:
            print("  " + message.replace("\n", "\n  "))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
