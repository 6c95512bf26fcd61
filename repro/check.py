"""`tnt-repro check`: plan the runs, execute them, compare, report.

Runs, in this order (each with its own record directory under OUT/runs/):
  serial              1 rank, plain python, the harness's seed: the reference; stores its
                      weights at every step (Note [Every element compared])
  N devices           each device count N (1 included), through the launcher, same seed;
                      a run on N > 1 ranks that reduced no gradient is NOT DISTRIBUTED and
                      ends the check (the other runs would be alike)
  N devices (repeat)  the largest device count again: run-to-run determinism
  serial (production) exact mode only: serial with the production train step (exact mode
                      off), compared with the exact serial reference
  calibration         serial (tolerance mode) or serial (production) (exact mode) with
                      reversed batches (Note [Measured tolerance])
  as written 1 and 2  serial twice with deterministic ops and threads but without the
                      harness's seeds: does the script seed itself? (--no-as-written skips)
Runs whose ranks fit the cores run side by side (--jobs; Note [Runs side by side] in repro/schedule.py);
their results are read in this order.
Every run gets tarantella.determinism.environment(seed) (threads, op determinism,
PYTHONHASHSEED); exact mode adds TNT_EXACT_VIRTUAL_BATCHES and the
recursive-doubling allreduce to all runs but serial (production) and its calibration.
Every run after the reference names the record it is compared with (TNT_REPRO_REFERENCE):
its master rank computes its differences to that record's weights on the rank.
--wrap (TNT_REPRO_WRAP, repro/wrap.py) trains the script's keras.Model through tnt.Model in
the runs through the launcher and in exact mode's serial reference; the serial reference of
tolerance mode, serial (production) and the calibration run the script as written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

from repro import progress as progress_display
from repro import records, runs, schedule, tolerance as tolerance_module, verdicts
from repro import wrap as wrap_module
from repro.compare import differences
from tarantella import determinism
from tarantella._repro import protocol

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
    wrap: bool = False             # train the script's keras.Model through tnt.Model (repro/wrap.py)
    jobs: int = 1                  # cores for runs side by side (Note [Runs side by side] in repro/schedule.py)


@dataclasses.dataclass
class CheckOutcome:
    verdicts: list[dict]
    runs: list[runs.RunResult]
    tolerance: tolerance_module.Tolerance | None
    record_by_run: dict[str, records.Record]

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v["verdict"] in verdicts.PASSING for v in self.verdicts)

    @property
    def undecided(self) -> bool:
        """No verdict failed, and at least one could not be decided (Note [Undecided] in repro/tolerance.py)."""
        return bool(self.verdicts) and all(v["verdict"] in verdicts.PASSING + (verdicts.UNDECIDED,)
                                           for v in self.verdicts) and not self.passed


PRODUCTION = "serial (production)"


def _common_env(options: CheckOptions, exact: bool) -> dict[str, str]:
    env = determinism.environment(options.seed)
    if options.steps:
        env[protocol.MAX_STEPS_VARIABLE] = str(options.steps)
    if options.epochs:
        env[protocol.MAX_EPOCHS_VARIABLE] = str(options.epochs)
    if exact:
        env["TNT_EXACT_VIRTUAL_BATCHES"] = str(options.virtual_batches)
        env["TNT_ALLREDUCE_ALGORITHM"] = "recursive_doubling"
    return env


def _with(env: dict, *, reference: str | None = None, store: bool = False, wrap: bool = False, **extra) -> dict:
    env = {**env, **extra}
    if reference:
        env[protocol.REFERENCE_VARIABLE] = reference
    if store:
        env[protocol.STORE_WEIGHTS_VARIABLE] = "1"
    if wrap:
        env[wrap_module.WRAP_VARIABLE] = "1"
    return env


def plan_runs(options: CheckOptions) -> list[runs.RunSpec]:
    exact = options.mode == "exact"
    env = _common_env(options, exact)
    serial = _directory(options, "serial")
    plan = [runs.RunSpec("serial", 1, "reference", _with(env, store=True, wrap=options.wrap and exact), False)]
    distributed = _with(env, reference=serial, wrap=options.wrap)
    for devices in sorted(set(options.devices)):
        plan.append(runs.RunSpec(_devices_name(devices), devices, "distributed", distributed, True))
    repeat = max(options.devices)
    plan.append(runs.RunSpec(_devices_name(repeat) + " (repeat)", repeat, "repeat", distributed, True))
    calibrated = serial
    if exact:
        production_env = _common_env(options, exact=False)
        plan.append(runs.RunSpec(PRODUCTION, 1, "production", _with(production_env, reference=serial, store=True),
                                 False))
        calibrated, env = _directory(options, PRODUCTION), production_env
    plan.append(runs.RunSpec("calibration", 1, "calibration",
                             _with(env, reference=calibrated, TNT_REPRO_CALIBRATE="reverse"), False))
    if options.as_written:
        unseeded = {key: value for key, value in _common_env(options, exact).items()
                    if key != determinism.SEED_VARIABLE}
        unseeded["TNT_REPRO_OPS_ONLY"] = "1"
        plan += [runs.RunSpec(f"as written {i}", 1, "as_written", unseeded, False) for i in (1, 2)]
    return plan


def _devices_name(devices: int) -> str:
    return f"{devices} device{'s' if devices != 1 else ''}"


def _directory(options: CheckOptions, name: str) -> str:
    return os.path.join(options.out, "runs", name.replace(" ", "_").replace("(", "").replace(")", ""))


def _needs(options: CheckOptions, plan: list[runs.RunSpec]) -> dict[str, str | None]:
    """Each run's reference run (the one whose stored weights it reads while it runs), by name."""
    by_directory = {_directory(options, spec.name): spec.name for spec in plan}
    return {spec.name: by_directory.get(spec.env.get(protocol.REFERENCE_VARIABLE)) for spec in plan}


def run_check(options: CheckOptions) -> CheckOutcome:
    plan = plan_runs(options)
    for spec in plan:   # a run may read its reference while both run: no step of an earlier check may be there
        shutil.rmtree(_directory(options, spec.name), ignore_errors=True)
    display = progress_display.Progress(len(plan), options.steps, live_updates=options.jobs == 1)

    def execute(spec, stop):
        return runs.execute(spec, options.script, list(options.script_args), _directory(options, spec.name),
                            options.timeout, lambda step, seconds: display.update(spec.name, step, seconds), stop)
    ordered = schedule.in_plan_order(plan, _needs(options, plan), options.jobs, execute,
                                       lambda spec: display.start(spec.name))
    results: list[runs.RunResult] = []
    recorded: dict[str, records.Record] = {}
    found: list[dict] = []
    refused: set[str] = set()
    with contextlib.closing(ordered):
        _read_results(options, ordered, display, results, recorded, found, refused)
    tolerance = _compare(options, plan, recorded, found, refused)
    return CheckOutcome(found, results, tolerance, recorded)


def _read_results(options, ordered, display, results, recorded, found, refused) -> None:
    """The runs' results in the plan's order; stops at the first that decides the others (a failed or refused
    run: the other runs have the same set-up)."""
    for result in ordered:
        spec = result.spec
        results.append(result)
        if not result.succeeded:
            display.finish(spec.name, "FAILED" if result.returncode is not None else "TIMED OUT", result.seconds)
            refusal = result.determinism_failure()
            if refusal is None:
                raise CheckError(f"{os.path.basename(options.script)} failed on {spec.devices} device"
                                 f"{'s' if spec.devices > 1 else ''} ({spec.name}): {result.failure_line()} "
                                 f"[exit code {result.returncode}; output in {result.directory}]")
            found.append(verdicts.failed_run(spec.name, spec.devices, spec.role, refusal))
            if spec.role != "as_written":
                break  # the other runs have the same set-up and would be refused alike
            continue
        display.finish(spec.name, "done", result.seconds)
        try:
            recorded[spec.name] = records.load_record(result.directory, spec.name)
        except records.RecordMissing as error:
            raise CheckError(f"{os.path.basename(options.script)} on {spec.devices} device(s): {error}; "
                             f"check needs a script that trains with fit") from None
        refusal = verdicts.not_distributed(recorded[spec.name], spec.devices) \
            if spec.role in ("distributed", "repeat") else None
        if refusal is not None:
            found.append(refusal)
            refused.add(spec.name)
            break  # every other run of this script would distribute nothing alike


def _compare(options, plan, recorded, found, refused) -> tolerance_module.Tolerance | None:
    reference = recorded.get("serial")
    if reference is None:
        return None
    exact = options.mode == "exact"
    tolerance = None
    calibrated = recorded.get(PRODUCTION if exact else "serial")
    if calibrated is not None and "calibration" in recorded:
        calibration = recorded["calibration"]
        tolerance = tolerance_module.derive(differences(calibrated, calibration), calibrated.compute_dtype,
                                            split=bool(calibration.notes.get(protocol.CALIBRATION_SPLIT_NOTE)))
    repeat_spec = next(spec for spec in plan if spec.role == "repeat")
    original_name = _devices_name(repeat_spec.devices)
    if refused:
        return tolerance
    for spec in plan:
        if spec.role == "distributed" and spec.name in recorded:
            found.append(verdicts.equivalence(reference, recorded[spec.name], spec.devices,
                                              None if exact else tolerance, exact=exact))
    if exact and PRODUCTION in recorded:
        label = "exact serial vs production serial"
        found.append(verdicts.ghost_batches_not_compared(reference, label) if reference.batch_norm_layers else
                     verdicts.equivalence(reference, recorded[PRODUCTION], 1, tolerance, exact=False, label=label))
    if repeat_spec.name in recorded and original_name in recorded:
        found.append(verdicts.run_to_run(recorded[original_name], recorded[repeat_spec.name], repeat_spec.devices))
    if "as written 1" in recorded and "as written 2" in recorded:
        found.append(verdicts.as_written(recorded["as written 1"], recorded["as written 2"], tolerance))
    return tolerance
