r"""tnt-bench: MLPerf-style scaling benchmarks for tarantella, with results, plots and simulation.

    tnt-bench scaling --model resnet50_small --devices 1..2 --steps 10 --out results/r50
    tnt-bench scaling --model resnet50 --devices 1..96   (measures what fits here, simulates
        the rest on --cluster, default supermuc_ng: one runs.csv, one plot, both marked)
    tnt-bench scaling --model resnet50 --devices 1..96 --simulate --cluster hpc_da \
        --model-profile results/r50/profile.json --out results/r50_hpc_da
    tnt-bench scaling --model resnet50_small --devices 1,2,4 --oversubscribe \
        --cluster this_machine --out results/r50_validate     (measure and predict: validation.csv)
    tnt-bench plot results/r50 results/r50_keras --out results/compare
    tnt-bench train --benchmark mini_digits -n 2
    tnt-bench validate results/r50_validate --cluster this_machine   (2 and 4 ranks predicted
        from the 1-rank data only: validation.csv/.json with the profile and its hash)
    tnt-bench validate --published horovod --out results/validation/horovod
        (Horovod's published efficiencies, predicted from its hardware's published facts)
    tnt-bench calibrate               (this machine's memory bandwidth, one process)
    tnt-bench allreduce --ranks 2,4   (the engine's algorithms against MPI_Allreduce)

Devices: a range A..B (powers of two between, plus both ends), a list 1,2,6,12, or one
count. Bad input ends with one line `tnt-bench: error: ...` and exit code 2; a failed
run with exit code 1.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

from bench.errors import USAGE_EXIT_CODE, BenchUsageError
from bench.quiet import LOAD_EXCESS, SPREAD, baseline_not_quiet

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")  # Keras dtype policies (tnt-bench --precision)

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise BenchUsageError(message)


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _add_scaling(commands):
    from bench.models.registry import MODELS
    parser = commands.add_parser("scaling", help="run (or simulate) a scaling sweep",
                                 description="Run the model on each device count through the tarantella "
                                             "launcher and record step times, throughput, epoch time, "
                                             "speedup and efficiency against 1 device.")
    parser.add_argument("--model", required=True, help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("--devices", default="1..2", help="A..B, a list 1,2,6,12, or N (default 1..2)")
    parser.add_argument("--framework", choices=("tnt", "keras"), default="tnt",
                        help="tnt: tnt.Model data parallelism; keras: plain Keras, each rank trains "
                             "its share with no gradient exchange (baseline). Default tnt")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--micro-batch", type=_positive_int,
                       help="examples per device (weak scaling); default: the model's")
    batch.add_argument("--global-batch", type=_positive_int,
                       help="examples per step over all devices (strong scaling)")
    parser.add_argument("--steps", type=_positive_int, default=10, help="timed steps per run (default 10)")
    parser.add_argument("--warmup-steps", type=int, default=2,
                        help="untimed steps first, including tracing (default 2)")
    parser.add_argument("--data", default="synthetic",
                        help="synthetic (default), jpeg (MLPerf's ResNet-50 input pipeline over a generated "
                             "ImageNet-like JPEG set), jpeg:DIR (its train-* TFRecord files) or tfds:NAME")
    parser.add_argument("--data-dir", help="TFDS data directory (default: TFDS_DATA_DIR or ~/tensorflow_datasets)")
    parser.add_argument("--input-sharding", choices=("files", "after-decode"), default="files",
                        help="with --data jpeg: files (default: each rank reads and decodes its own files, as MLPerf's "
                             "reference and tarantella.data do), or after-decode (every rank decodes the whole "
                             "global batch and keeps its micro-batch, as the original Tarantella's published "
                             "ResNet-50 runs did: Note [Sharding after the decode] in bench/data/jpeg_pipeline.py)")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="the Keras dtype policy to train at (MLPerf trains in mixed precision); recorded in "
                             "every row, and the simulation takes the cluster's stated speed at it. Default float32")
    parser.add_argument("--hostfile", help="hosts to run on, as for the tarantella launcher")
    parser.add_argument("--npernode", type=_positive_int, help="ranks per host")
    parser.add_argument("--launch-agent", help="passed to the tarantella launcher (how mpirun reaches a host)")
    parser.add_argument("--network-interface", help="passed to the tarantella launcher (MPI's TCP interface "
                                                    "or subnet); with --launch-agent, a namespace cluster: "
                                                    "python -m bench.cluster run ... $NETNS_CLUSTER_ARGS")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="allow more ranks than cores on this machine (rows marked oversubscribed)")
    parser.add_argument("--simulate", action="store_true",
                        help="predict the whole sweep on --cluster instead of running it")
    parser.add_argument("--cluster", help="cluster profile: a TOML file or a shipped one (hpc_da, "
                                          "supermuc_ng, this_machine, horovod_pascal_roce; hpc-da or "
                                          "HPC-DA work too). Counts beyond this machine (or the "
                                          "hostfile) are simulated on it, default supermuc_ng; with "
                                          "counts that all run here, it also predicts them "
                                          "(validation.csv)")
    parser.add_argument("--model-profile", help="profile.json of an earlier sweep to simulate from "
                                                "(default: measure the 1-device profile now)")
    parser.add_argument("--out", help="result directory (default results/<model>_<framework>)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (default 1800)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--timeline", metavar="DIR",
                        help="record each measured run's timeline (Chrome/Perfetto trace) as "
                             "DIR/<model>_<framework>_x<devices>.json (tarantella --timeline)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--kill-rank-at", type=_positive_int, metavar="STEP",
                        help="then run the largest measured count again under `tarantella --elastic` with its last "
                             "rank killed (SIGKILL) after this step (warm-up counted): a row with the recovery time")


def _add_plot(commands):
    parser = commands.add_parser("plot", help="plot one or more sweep directories, overlaid")
    parser.add_argument("directories", nargs="+", help="directories holding runs.csv")
    parser.add_argument("--out", help="where to write the plots (default: the first directory)")
    parser.add_argument("--title")


def _add_train(commands):
    parser = commands.add_parser("train", help="train a benchmark to its quality target (MLPerf style)")
    parser.add_argument("--benchmark", required=True, help="a spec name from bench/specs/")
    parser.add_argument("-n", "--devices", type=_positive_int, default=1, help="ranks (default 1)")
    parser.add_argument("--framework", choices=("tnt", "keras"), default="tnt")
    parser.add_argument("--global-batch", type=_positive_int, help="default: the spec's")
    parser.add_argument("--max-epochs", type=_positive_int, help="default: the spec's")
    parser.add_argument("--data-dir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="directory for the MLLOG log and result.json")
    parser.add_argument("--timeout", type=float, default=3600.0)


def _add_validate(commands):
    parser = commands.add_parser("validate", help="predict measured or published results out of sample "
                                                  "and write the error per point")
    parser.add_argument("directory", nargs="?",
                        help="a measured sweep directory (runs.csv, profile.json, a 1-device run): "
                             "its counts predicted from its 1-rank data only")
    parser.add_argument("--cluster", default="this_machine", help="cluster profile (default this_machine)")
    parser.add_argument("--published", help="instead of a directory: published results of another "
                                            "system (horovod)")
    parser.add_argument("--out", help="with --published: where to write (default results/validation/NAME)")


def _add_calibrate(commands):
    parser = commands.add_parser("calibrate", help="measure this machine's memory bandwidth (1 process) "
                                                   "for its cluster profile; -n 2: fit the allreduce")
    parser.add_argument("-n", "--devices", type=_positive_int, default=1)
    parser.add_argument("--tcp", action="store_true", help="also the loopback TCP path (for the namespace "
                                                            "cluster's profile)")
    parser.add_argument("--max-bytes", type=_positive_int, default=64 << 20)


def _add_allreduce(commands):
    from bench.allreduce.run import add_arguments
    parser = commands.add_parser("allreduce", help="time the engine's allreduce algorithms against MPI")
    add_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tnt-bench", description=__doc__.split("\n\n")[0],
                     epilog=__doc__[__doc__.index("\n\n") + 2:],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_scaling(commands)
    _add_train(commands)
    _add_plot(commands)
    _add_validate(commands)
    _add_calibrate(commands)
    _add_allreduce(commands)
    return parser


def _scaling(args, argv) -> int:
    from bench.models.registry import get_model_entry
    from bench.sweep.device_counts import parse_device_counts
    from bench.sweep.options import SweepOptions
    from bench.sweep.scaling import run_scaling
    entry = get_model_entry(args.model)
    counts = parse_device_counts(args.devices)
    _check_data(args.data, entry)
    from bench.data import jpeg_pipeline
    if args.input_sharding != "files" and not jpeg_pipeline.is_jpeg(args.data):
        raise BenchUsageError(f"--input-sharding {args.input_sharding} needs --data jpeg (a pipeline that decodes); "
                              f"--data is {args.data}")
    if args.data == "jpeg" and not args.simulate:   # made once, before any run is timed
        from bench.data import imagenet_like
        directory, description = imagenet_like.ensure_set()
        print(f"tnt-bench: --data jpeg reads the generated ImageNet-like set in {directory} "
              f"({description['images']} images, mean {description['mean_bytes'] / 1024:.0f} KiB; ImageNet's "
              f"{imagenet_like.IMAGENET_MEAN_BYTES / 1024:.0f} KiB)")
        args.data = f"jpeg:{directory}"
    if args.model_profile and not args.simulate:
        raise BenchUsageError("--model-profile is used with --simulate only")
    options = SweepOptions(
        model=args.model, counts=counts, framework=args.framework, micro_batch=args.micro_batch,
        global_batch=args.global_batch, steps=args.steps, warmup_steps=args.warmup_steps,
        data=args.data, data_dir=args.data_dir, precision=args.precision, hostfile=args.hostfile,
        input_sharding=args.input_sharding,
        npernode=args.npernode,
        launch_agent=args.launch_agent, network_interface=args.network_interface,
        oversubscribe=args.oversubscribe, simulate=args.simulate, cluster=args.cluster,
        model_profile=args.model_profile,
        out=args.out or f"results/{args.model}_{args.framework}", timeout_s=args.timeout,
        seed=args.seed, timeline_dir=args.timeline, plots=not args.no_plots, progress=not args.quiet,
        kill_rank_at=args.kill_rank_at,
        command="tnt-bench " + shlex.join(argv))
    summary = run_scaling(options)
    _print_points(summary)
    print(f"tnt-bench: wrote {', '.join(summary['files'])} to {options.out}")
    return 0


def _check_data(data: str, entry) -> None:
    import os

    from bench.data import jpeg_pipeline
    if data == "synthetic" or data.startswith("tfds:"):
        return
    if jpeg_pipeline.is_jpeg(data):
        if entry.kind != "image":
            raise BenchUsageError(f"--data {data}: JPEG input feeds image models; {entry.name} is a {entry.kind} model")
        directory = jpeg_pipeline.given_directory(data)
        if directory is not None and not os.path.isdir(directory):
            raise BenchUsageError(f"--data {data}: no such directory")
        return
    raise BenchUsageError(f"--data {data!r}: expected synthetic, jpeg, jpeg:DIR or tfds:NAME")


def _print_points(summary):
    unit = summary["model"]["unit"]
    points = summary["points"]
    bound = any(isinstance(point.get("bound_by"), str) for point in points)   # Note [Input-bound]
    print(f"{'devices':>7} {'kind':>22} {'step s':>9} {unit + '/s':>12} {'epoch min':>10} "
          f"{'speedup':>8} {'effic.':>7}  " + (f"{'bound by':<30}" if bound else "") + "machine")
    notes = [_machine_note(point) for point in points]
    for point, note in zip(points, notes):
        kind = f"simulated {point['cluster']}" if point["simulated"] else (
            "measured, oversub." if point["oversubscribed"] else "measured")
        bound_by = (f"{point['bound_by']} (input {point['input_share']:.0%} of a step)"
                    if isinstance(point.get("bound_by"), str) else "")
        print(f"{point['devices']:>7} {kind:>22} {point['step_time_median_s']:>9.4f} "
              f"{point['throughput']:>12.1f} {point['epoch_time_min']:>10.2f} "
              f"{point['speedup']:>8.2f} {point['efficiency']:>7.2f}  " + (f"{bound_by:<30}" if bound else "")
              + note)
    if any(note not in ("", "quiet") for note in notes):
        print(f"tnt-bench: a run marked 'not quiet' shared its machine with other work (the load average more than "
              f"{LOAD_EXCESS:g} beyond its own threads, or step times that spread over {SPREAD:.0%}): its times and "
              f"the speedups against it are not the system's. Measure again on a quiet machine "
              f"(docs/guides/benchmarking.md, 'A quiet machine').")
    _print_published(summary)
    _print_rank_loss(summary)


def _machine_note(point) -> str:
    """The quiet column of a measured point (Note [A quiet machine] in bench/quiet.py)."""
    if point["simulated"] or point.get("quiet") not in (True, False):   # simulated, or measured before it was judged
        return ""
    note = "quiet" if point["quiet"] else f"NOT QUIET: {point['not_quiet_because']}"
    if baseline_not_quiet(point.get("speedup_baseline")):
        note += "; speedup against a 1-device run that was not quiet"
    return note


def _print_published(summary):
    """Published measurements of the simulated cluster beside the simulated speedups (issue 41 §3)."""
    simulated = {point["devices"]: point["speedup"] for point in summary["points"] if point["simulated"]}
    for curve in summary.get("published", []):
        print(f"{curve['label']} on {curve['cluster']}:")
        print(f"{'devices':>7} {'published speedup':>18} {'simulated (' + summary['model']['name'] + ')':>28}")
        for devices, speedup in zip(curve["devices"], curve["speedup"]):
            if devices > 1:
                here = f"{simulated[devices]:.2f}x" if devices in simulated else "-"
                print(f"{devices:>7} {speedup:>17.2f}x {here:>28}")


def _print_rank_loss(summary):
    """The --kill-rank-at row (bench/sweep/rank_loss.py)."""
    loss = summary.get("rank_loss")
    if not loss:
        return
    print(f"with a rank lost (tarantella --elastic; rank {loss['killed_rank']} killed by SIGKILL after step "
          f"{loss['killed_after_step']}):")
    print(f"{'devices':>7} {'after':>6} {'recovery s':>11} {'steps redone':>13} {'step s before':>14} "
          f"{'step s after':>13}")
    print(f"{loss['devices']:>7} {loss['devices_after']:>6} {loss['recovery_s']:>11.1f} {loss['steps_redone']:>13} "
          f"{loss['step_time_before_s']:>14.4f} {loss['step_time_after_s']:>13.4f}")
    print("tnt-bench: recovery runs from the kill to the end of the first step the survivors trained: the loss "
          "found, the ranks started, the model built, the last commit read, its first step traced and trained.")


def _plot(args) -> int:
    import os
    from bench.plots import plot_directories
    for directory in args.directories:
        if not os.path.exists(os.path.join(directory, "runs.csv")):
            raise BenchUsageError(f"{directory} holds no runs.csv (is it a tnt-bench result directory?)")
    written = plot_directories(args.directories, args.out or args.directories[0], args.title)
    print(f"tnt-bench: wrote {', '.join(written)}")
    return 0


def _train(args, argv) -> int:
    from bench.train_run import run_training
    return run_training(args, "tnt-bench " + shlex.join(argv))


def _validate(args, command) -> int:
    if args.published:
        if args.directory:
            raise BenchUsageError("give a sweep directory or --published NAME, not both")
        from bench.validation.published import validate_published
        out = args.out or f"results/validation/{args.published}"
        points = validate_published(args.published, out, command)
        print(f"{'model':>14} {'devices':>7} {'published':>9} {'predicted':>9} {'error':>8}")
        for p in points:
            print(f"{p['model']:>14} {p['devices']:>7} {p['published_efficiency']:>9.1%} "
                  f"{p['predicted_efficiency']:>9.1%} {p['error_points']:>+7.1f}pt")
        print(f"tnt-bench: wrote validation.csv, validation.json to {out}")
        return 0
    if not args.directory:
        raise BenchUsageError("validate needs a measured sweep directory or --published NAME")
    from bench.sweep.revalidate import revalidate
    summary = revalidate(args.directory, args.cluster, command)
    _print_points(summary)
    print(f"{'devices':>7} {'role':>12} {'measured s':>10} {'predicted s':>11} {'error':>8}")
    for p in summary["validation"]:
        print(f"{p['devices']:>7} {p['role']:>12} {p['measured_step_s']:>10.4f} {p['predicted_step_s']:>11.4f} "
              f"{p['relative_error']:>+8.1%}")
    return 0


def _calibrate(args) -> int:
    from bench.simulate.calibrate import run_calibration
    print(run_calibration(args.devices, args.max_bytes, args.tcp))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "scaling":
            return _scaling(args, argv)
        if args.command == "plot":
            return _plot(args)
        if args.command == "train":
            return _train(args, argv)
        if args.command == "validate":
            return _validate(args, "tnt-bench " + shlex.join(argv))
        if args.command == "calibrate":
            return _calibrate(args)
        if args.command == "allreduce":
            from bench.allreduce.run import run
            return run(args)
    except BenchUsageError as error:
        print(f"tnt-bench: error: {error}", file=sys.stderr, flush=True)
        return USAGE_EXIT_CODE
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except RuntimeError as error:  # SweepRunError, TrainingRunError
        print(f"tnt-bench: error: {error}", file=sys.stderr, flush=True)
        return 1
    raise AssertionError(f"unhandled command {args.command!r}")
