"""tnt-repro: does a training script reproduce serial training when distributed?

    tnt-repro check train.py [script args] --devices 1,2,4 [--seed S] [--wrap]
                   [--steps K | --epochs E] [--mode tolerance|exact] [--out DIR] [--jobs J]
    tnt-repro lint train.py [more.py ...]

check  runs the unmodified script (which trains with tnt.Model) serially and on
       each device count under enforced determinism (tarantella/determinism.py),
       records per-step losses, every weight element (chunk hashes on every rank,
       max absolute and relative differences to the serial run on the master rank),
       the world size, the strategy and the gradient reductions the engine performed,
       through the recorder tnt.Model.fit adds (tarantella/_repro/hook.py), and prints
       one verdict per comparison with its scope (tensors, elements, steps, ranks):
         serial vs N devices   IDENTICAL | EQUIVALENT | DIVERGENT (first step, layer, likely cause)
                               | NOT DISTRIBUTED (N ranks but no gradient reduction: a model
                               never wrapped in tnt.Model; the line says how to fix it)
         run-to-run            IDENTICAL | NONDETERMINISTIC (largest device count twice)
         as written            IDENTICAL | SEED_DEPENDENT (serially twice without the harness's seeds)
                               | UNDECIDED (tolerance mode: the calibration itself exceeded the
                               cap 2^-12 and the run differs by more than the cap but less than
                               16 x the calibration; Note [Undecided] in repro/tolerance.py)
       --mode tolerance: EQUIVALENT within a tolerance measured by a calibration
       run (the serial run with reversed batches; Note [Derived tolerance] in
       repro/tolerance.py), capped at 2^-12. --mode exact: the script trains in exact
       mode (Note [Exact mode] in tarantella/_repro/exact_reduction.py); IDENTICAL means
       every N-rank run equals the 1-rank serial run (exact train step) bit for bit,
       anything short of it is DIVERGENT; that serial run is also compared with the
       production train step's serial run (exact serial vs production serial, within
       the measured tolerance). --wrap: the script is plain Keras (never imports
       tarantella); its keras.Model trains through tnt.Model on the distributed runs
       (repro/wrap.py). Writes report.json and loss_curves.png to --out
       (default results/repro/<script>-<mode>-<time>/).
       Script arguments go before or after the options; put them after `--` when
       they look like tnt-repro options.
lint   static checks (no execution) for the known reproducibility pitfalls; one line
       per finding: file:line: code message; fix: ...

Exit codes: 0 all verdicts pass / no findings; 1 a verdict fails / findings;
2 bad input or a script that fails for another reason (one line
`tnt-repro: error: ...`); 3 no verdict fails but one is UNDECIDED.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

__all__ = ["main", "build_parser"]

USAGE_ERROR = 2
CHECK_FAILED = 1
CHECK_UNDECIDED = 3
DEFAULT_OUT_ROOT = os.path.join("results", "repro")


class UsageError(Exception):
    """Bad input: one line `tnt-repro: error: ...`, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _device_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--devices expects comma-separated whole numbers such as 1,2,4, got {text!r}") from None
    if not counts or any(count < 1 for count in counts):
        raise UsageError(f"--devices needs device counts of at least 1 (such as 1,2,4), got {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tnt-repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    check = commands.add_parser("check", help="serial vs distributed, run-to-run and seed checks of a script")
    check.add_argument("script", help="the training script (uses tnt.Model)")
    check.add_argument("--devices", default="1,2,4", help="device counts to compare with serial (default 1,2,4)")
    check.add_argument("--seed", type=int, default=42, help="seed the harness applies (default 42)")
    limit = check.add_mutually_exclusive_group()
    limit.add_argument("--steps", type=int, help="stop every run after K training steps")
    limit.add_argument("--epochs", type=int, help="stop every run after at most E epochs")
    check.add_argument("--mode", choices=("tolerance", "exact"), default="tolerance",
                       help="tolerance (default): IDENTICAL or EQUIVALENT pass; exact: only IDENTICAL passes")
    check.add_argument("--virtual-batches", type=int,
                       help="exact mode: virtual micro-batches per global batch (default: the largest device "
                            "count rounded up to a power of two)")
    check.add_argument("--out", help="output directory (default results/repro/<script>-<mode>-<time>)")
    check.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed (900)")
    check.add_argument("--jobs", type=int,
                       help="cores for runs side by side: runs whose ranks fit start together (default: the cores "
                            "this process may use; 1: one run at a time; Note [Runs side by side] in "
                            "repro/schedule.py)")
    check.add_argument("--no-as-written", dest="as_written", action="store_false",
                       help="skip the two unseeded serial runs")
    check.add_argument("--wrap", action="store_true",
                       help="train a plain Keras script's keras.Model through tnt.Model (distributed runs, and "
                            "exact mode's serial reference); the script needs no change")
    lint = commands.add_parser("lint", help="static checks for reproducibility pitfalls")
    lint.add_argument("scripts", nargs="+", help="Python files to check")
    return parser


def _check_options(parsed, script_args):
    from repro import schedule
    from repro.check import CheckOptions
    from tarantella._repro import exact_reduction
    script = parsed.script
    if not os.path.isfile(script):
        raise UsageError(f"no such script: {script!r}")
    devices = _device_counts(parsed.devices)
    if parsed.steps is not None and parsed.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {parsed.steps}")
    if parsed.epochs is not None and parsed.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {parsed.epochs}")
    if not 0 <= parsed.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2**32), got {parsed.seed}")
    if parsed.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {parsed.timeout}")
    if parsed.jobs is not None and parsed.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {parsed.jobs}")
    virtual = None
    if parsed.mode == "exact":
        virtual = parsed.virtual_batches or 1 << (max(devices) - 1).bit_length()
        try:
            for count in devices:
                exact_reduction.check_decomposition(virtual, count)
        except ValueError as error:
            raise UsageError(str(error).replace("tarantella exact mode", "--mode exact")
                             .replace("TNT_EXACT_VIRTUAL_BATCHES", "--virtual-batches")) from None
    elif parsed.virtual_batches is not None:
        raise UsageError("--virtual-batches applies to --mode exact only")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = os.path.splitext(os.path.basename(script))[0]
    out = parsed.out or os.path.join(DEFAULT_OUT_ROOT, f"{name}-{parsed.mode}-{stamp}")
    return CheckOptions(os.path.abspath(script), tuple(script_args), devices, parsed.seed, parsed.steps,
                        parsed.epochs, parsed.mode, virtual, os.path.abspath(out), parsed.timeout, parsed.as_written,
                        parsed.wrap, parsed.jobs or schedule.usable_cores())


def _run_check(options) -> int:
    from repro import report
    from repro.check import CheckError, run_check
    os.makedirs(options.out, exist_ok=True)
    print(f"tnt-repro check {os.path.basename(options.script)}: devices {','.join(map(str, options.devices))}, "
          f"seed {options.seed}, mode {options.mode}"
          + (f" ({options.virtual_batches} virtual micro-batches)" if options.virtual_batches else "")
          + f"; output in {options.out}", flush=True)
    try:
        outcome = run_check(options)
    except CheckError as error:
        print(f"tnt-repro: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    plot = report.plot_loss_curves(options, outcome)
    path = report.write_report(options, outcome, plot)
    print(f"reference: {report.describe_reference(options, outcome)}")
    if outcome.tolerance is not None:
        scope = " (exact serial vs production serial only)" if options.mode == "exact" else ""
        print(f"tolerance{scope}: {outcome.tolerance.how}")
    for line in report.verdict_lines(outcome):
        print(line)
    status = "PASSED" if outcome.passed else "UNDECIDED" if outcome.undecided else "FAILED"
    print(f"{status}; report {path}" + (f", plot {plot}" if plot else ""))
    return 0 if outcome.passed else CHECK_UNDECIDED if outcome.undecided else CHECK_FAILED


def _run_lint(paths) -> int:
    from repro import lint
    findings = []
    for path in paths:
        if not os.path.isfile(path):
            raise UsageError(f"no such script: {path!r}")
        try:
            findings += lint.lint_file(path)
        except SyntaxError as error:
            raise UsageError(f"{path}:{error.lineno}: cannot parse: {error.msg}") from None
    for finding in findings:
        print(finding.format())
    print(f"tnt-repro lint: {len(findings)} finding{'s' if len(findings) != 1 else ''} in {len(paths)} file"
          f"{'s' if len(paths) != 1 else ''}")
    return CHECK_FAILED if findings else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        if "--" in argv:
            at = argv.index("--")
            argv, forwarded = argv[:at], argv[at + 1:]
        else:
            forwarded = []
        parsed, unknown = parser.parse_known_args(argv)
        if parsed.command is None:
            parser.print_help()
            return USAGE_ERROR
        if parsed.command == "lint":
            if unknown or forwarded:
                raise UsageError(f"unrecognized arguments: {' '.join(unknown + forwarded)}")
            return _run_lint(parsed.scripts)
        return _run_check(_check_options(parsed, unknown + forwarded))
    except UsageError as error:
        print(f"tnt-repro: error: {error}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
