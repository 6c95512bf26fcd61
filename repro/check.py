"""`tnt-repro check`: plan the runs, execute them, compare, report.

Runs, in this order (each with its own record directory under OUT/runs/):
  serial              1 rank, plain python, the harness's seed: the reference
  calibration         tolerance mode: serial with reversed batches (Note [Measured tolerance])
  N devices           each device count N (1 included), through the launcher, same seed
  N devices (repeat)  the largest device count again: run-to-run determinism
  as written 1 and 2  serial twice with deterministic ops and threads but without the
                      harness's seeds: does the script seed itself? (--no-as-written skips)
Every run gets tarantella.determinism.environment(seed) (threads, op determinism,
PYTHONHASHSEED); exact mode adds TNT_EXACT_VIRTUAL_BATCHES and the
recursive-doubling allreduce to all of them.
"""
from __future__ import annotations

import dataclasses
import os

from repro import progress as progress_display
from repro import records, runs, tolerance as tolerance_module, verdicts
from repro.compare import differences
from tarantella import determinism

__all__ = ["CheckOptions", "CheckOutcome", "plan_runs", "run_check", "CheckError"]


class CheckError(RuntimeError):
    """The check could not be carried out (the script fails for reasons other than determinism)."""


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    script: str
    script_args: tuple[str, ...]
    devices: tuple[int, ...]
    seed: int
    steps: int | None
    epochs: int | None
    mode: str                      # tolerance | exact
    virtual_batches: int | None    # exact mode
    out: str
    timeout: float                 # seconds per run
    as_written: bool


@dataclasses.dataclass
class CheckOutcome:
    verdicts: list[dict]
    runs: list[runs.RunResult]
    tolerance: tolerance_module.Tolerance | None
    record_by_run: dict[str, records.Record]

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v["verdict"] in verdicts.PASSING for v in self.verdicts)


def _common_env(options: CheckOptions) -> dict[str, str]:
    env = determinism.environment(options.seed)
    if options.steps:
        env["TNT_REPRO_MAX_STEPS"] = str(options.steps)
    if options.epochs:
        env["TNT_REPRO_MAX_EPOCHS"] = str(options.epochs)
    if options.mode == "exact":
        env["TNT_EXACT_VIRTUAL_BATCHES"] = str(options.virtual_batches)
        env["TNT_ALLREDUCE_ALGORITHM"] = "recursive_doubling"
    return env


def plan_runs(options: CheckOptions) -> list[runs.RunSpec]:
    env = _common_env(options)
    plan = [runs.RunSpec("serial", 1, "reference", env, use_launcher=False)]
    if options.mode == "tolerance":
        plan.append(runs.RunSpec("calibration", 1, "calibration", {**env, "TNT_REPRO_CALIBRATE": "reverse"}, False))
    for devices in sorted(set(options.devices)):
        plan.append(runs.RunSpec(_devices_name(devices), devices, "distributed", env, True))
    repeat = max(options.devices)
    plan.append(runs.RunSpec(_devices_name(repeat) + " (repeat)", repeat, "repeat", env, True))
    if options.as_written:
        unseeded = {key: value for key, value in env.items() if key != determinism.SEED_VARIABLE}
        unseeded["TNT_REPRO_OPS_ONLY"] = "1"
        plan += [runs.RunSpec(f"as written {i}", 1, "as_written", unseeded, False) for i in (1, 2)]
    return plan


def _devices_name(devices: int) -> str:
    return f"{devices} device{'s' if devices != 1 else ''}"


def _directory(options: CheckOptions, spec: runs.RunSpec) -> str:
    return os.path.join(options.out, "runs", spec.name.replace(" ", "_").replace("(", "").replace(")", ""))


def run_check(options: CheckOptions) -> CheckOutcome:
    plan = plan_runs(options)
    display = progress_display.Progress(len(plan), options.steps)
    results: list[runs.RunResult] = []
    recorded: dict[str, records.Record] = {}
    found: list[dict] = []
    for spec in plan:
        display.start(spec.name)
        result = runs.execute(spec, options.script, list(options.script_args), _directory(options, spec),
                              options.timeout, display.update)
        results.append(result)
        if not result.succeeded:
            display.finish("FAILED" if result.returncode is not None else "TIMED OUT", result.seconds)
            refusal = result.determinism_failure()
            if refusal is None:
                raise CheckError(f"{os.path.basename(options.script)} failed on {spec.devices} device"
                                 f"{'s' if spec.devices > 1 else ''} ({spec.name}): {result.failure_line()} "
                                 f"[exit code {result.returncode}; output in {result.directory}]")
            found.append(verdicts.failed_run(spec.name, spec.devices, spec.role, refusal))
            if spec.role != "as_written":
                break  # the other runs have the same set-up and would be refused alike
            continue
        display.finish("done", result.seconds)
        try:
            recorded[spec.name] = records.load_record(result.directory, spec.name)
        except records.RecordMissing as error:
            raise CheckError(f"{os.path.basename(options.script)} on {spec.devices} device(s): {error}; "
                             f"check needs a script that trains with fit") from None
    tolerance = _compare(options, plan, recorded, found)
    return CheckOutcome(found, results, tolerance, recorded)


def _compare(options, plan, recorded, found) -> tolerance_module.Tolerance | None:
    reference = recorded.get("serial")
    if reference is None:
        return None
    tolerance = None
    if options.mode == "tolerance" and "calibration" in recorded:
        tolerance = tolerance_module.derive(differences(reference, recorded["calibration"]))
    repeat_spec = next(spec for spec in plan if spec.role == "repeat")
    original_name = _devices_name(repeat_spec.devices)
    for spec in plan:
        if spec.role == "distributed" and spec.name in recorded:
            found.append(verdicts.equivalence(reference, recorded[spec.name], spec.devices, tolerance,
                                              exact=options.mode == "exact"))
    if repeat_spec.name in recorded and original_name in recorded:
        found.append(verdicts.run_to_run(recorded[original_name], recorded[repeat_spec.name], repeat_spec.devices))
    if "as written 1" in recorded and "as written 2" in recorded:
        found.append(verdicts.as_written(recorded["as written 1"], recorded["as written 2"]))
    return tolerance
