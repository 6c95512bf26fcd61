"""What `tnt-repro check` leaves behind: report.json, loss_curves.png, and the verdict lines.

report.json describes itself (machine, commit and dirty flag, versions, every
option, every run's command, exit code and timing, the tolerance and how it
was derived, the verdicts); the plot is drawn from the records it names.
"""
from __future__ import annotations

import datetime
import json
import os
import math
import statistics

from repro import verdicts
from repro.check import CheckOptions, CheckOutcome
from tarantella._provenance import describe_machine, describe_software, describe_source

__all__ = ["REPORT_NAME", "PLOT_NAME", "write_report", "plot_loss_curves", "verdict_lines", "describe_reference"]

REPORT_NAME = "report.json"
PLOT_NAME = "loss_curves.png"


def _environment() -> dict:
    return {"machine": describe_machine(), "source": describe_source(), "versions": describe_software()}


def describe_reference(options: CheckOptions, outcome: CheckOutcome) -> str:
    """What "serial" is: the run IDENTICAL and EQUIVALENT verdicts compare with."""
    record = outcome.record_by_run.get("serial")
    step = (f"exact mode's train step ({options.virtual_batches} virtual micro-batches summed in a fixed tree)"
            if options.mode == "exact" else "the production train step")
    trained = record.strategy if record is not None else "not recorded"
    return (f"serial: {os.path.basename(options.script)} in one plain Python process (no launcher, 1 rank), "
            f"seed {options.seed}, {step}; model trained: {trained}"
            + ("; --wrap: the script's keras.Model trained through tnt.Model"
               if options.wrap and options.mode == "exact" else ""))


def _run_entry(result, record) -> dict:
    seconds = record.step_seconds()[1:] if record is not None else []  # the first step traces
    return {"name": result.spec.name, "role": result.spec.role, "devices": result.spec.devices,
            "launcher": result.spec.use_launcher, "env": dict(result.spec.env), "directory": result.directory,
            "returncode": result.returncode, "wall_seconds": round(result.seconds, 3),
            "steps": record.step_count if record is not None else None,
            "world_size": record.world_size if record is not None else None,
            "strategy": record.strategy if record is not None else None,
            "gradient_reductions": record.gradient_reductions if record is not None else None,
            "reduction_count_source": record.reduction_count_source if record is not None else None,
            "compared_with": os.path.basename(record.reference) if record is not None and record.reference else None,
            "median_step_seconds": statistics.median(seconds) if seconds else None,
            "step_losses": record.step_losses() if record is not None else None}


def write_report(options: CheckOptions, outcome: CheckOutcome, plot_path: str | None) -> str:
    document = {
        "tool": "tnt-repro check",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **_environment(),
        "reference": describe_reference(options, outcome),
        "options": {"script": os.path.abspath(options.script), "script_args": list(options.script_args),
                    "devices": list(options.devices), "seed": options.seed, "steps": options.steps,
                    "epochs": options.epochs, "mode": options.mode, "virtual_batches": options.virtual_batches,
                    "timeout_seconds": options.timeout, "as_written": options.as_written, "wrap": options.wrap},
        "runs": [_run_entry(result, outcome.record_by_run.get(result.spec.name)) for result in outcome.runs],
        "tolerance": outcome.tolerance.as_dict() if outcome.tolerance is not None else None,
        "verdicts": outcome.verdicts,
        "passed": outcome.passed,
        "undecided": outcome.undecided,
        "plot": plot_path,
    }
    path = os.path.join(options.out, REPORT_NAME)
    with open(path, "w") as handle:
        json.dump(document, handle, indent=1, default=float)
    return path


def plot_loss_curves(options: CheckOptions, outcome: CheckOutcome) -> str | None:
    """Loss per step, serial vs each device count; and the weight differences against the tolerance."""
    reference = outcome.record_by_run.get("serial")
    if reference is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from repro.compare import differences
    figure, (losses, gaps) = plt.subplots(1, 2, figsize=(11, 4))
    steps = range(1, reference.step_count + 1)
    losses.plot(steps, reference.step_losses(), label="serial", color="black", linewidth=2.5)
    for name, record in outcome.record_by_run.items():
        if name.endswith("device") or name.endswith("devices"):
            losses.plot(range(1, record.step_count + 1), record.step_losses(), label=name, linestyle="--")
            diffs = differences(reference, record)
            gaps.semilogy(range(diffs.steps + 1), [max(row, default=0.0) + 1e-12 for row in diffs.weights.tolist()],
                          label=f"{name} vs serial")
    if outcome.tolerance is not None:
        gaps.semilogy(range(len(outcome.tolerance.weights)), outcome.tolerance.weights + 1e-12, color="red",
                      label="tolerance (derived)")
    losses.set(xlabel="step", ylabel="loss of the step", title=f"{os.path.basename(options.script)} ({options.mode})")
    gaps.set(xlabel="step", ylabel="max relative weight difference (+1e-12)", title="distance from serial")
    losses.legend()
    gaps.legend(fontsize="small")
    figure.tight_layout()
    path = os.path.join(options.out, PLOT_NAME)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _scope_line(compared: dict) -> str:
    ranks = compared["ranks"]
    return (f"    compared: {compared['tensors']} tensors, {compared['elements_per_step']:,} elements, "
            f"{compared['steps']} steps (initial weights included), rank{'s' if len(ranks) != 1 else ''} "
            f"{','.join(map(str, ranks))}; {compared['how']}")


def verdict_lines(outcome: CheckOutcome) -> list[str]:
    lines = []
    for verdict in outcome.verdicts:
        line = f"{verdict['check']:<44} {verdict['verdict']}"
        where = verdict.get("first_divergence")
        if where:
            difference = where["difference"]
            line += (f" at step {where['step']}, layer {where['layer']} ({where['variable']}): "
                     + (f"relative difference {difference:.3g}" if math.isfinite(difference)
                        else "bits differ" if difference != difference else "infinitely far (shape or NaN)")
                     + (f" > tolerance {where['tolerance']:.3g}" if where.get("tolerance") else ""))
        elif verdict["verdict"] == "EQUIVALENT":
            line += (f" (max relative weight difference {verdict['max_weight_difference']:.3g}, "
                     f"{100 * verdict.get('tolerance_used', 0):.2g} % of the tolerance)")
        elif verdict["verdict"] == "NOT DISTRIBUTED":
            line += f" ({verdict['world_size']} ranks, {verdict['gradient_reductions']} gradient reductions)"
        lines.append(line)
        if verdict.get("compared"):
            lines.append(_scope_line(verdict["compared"]))
        if verdict.get("cause"):
            settled = verdict["verdict"] in verdicts.PASSING + (verdicts.UNDECIDED,)
            lines.append(f"    {'why' if settled else 'likely cause'}: "
                         f"{verdict['cause']}")
        if verdict.get("fix"):
            lines.append(f"    fix: {verdict['fix']}")
    return lines
