"""Running the benchmark program on N devices through the launcher, and its runs.csv row."""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Callable

from bench.errors import BenchUsageError
from bench.input_bound import input_fields
from bench.launched_run import LaunchTimedOut, run_launched
from bench.programs.result_line import PROGRESS_TAG, parse_result_line
from bench.quiet import not_quiet_because
from bench.sweep.options import SweepOptions

__all__ = ["PROGRAM", "SweepRunError", "launch_command", "run_point", "measured_row"]

PROGRAM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "programs", "train_benchmark.py")
_FRAMEWORK_MISSING = 3   # train_benchmark.py's exit code


class SweepRunError(RuntimeError):
    """A benchmark run failed; the message holds its exit code and last output."""


def launch_command(options: SweepOptions, devices: int, micro_batch: int,
                   profile_out: str | None = None, fault: tuple[int, str] | None = None) -> list[str]:
    """fault: (step, record file) runs the job under --elastic with its last rank killed after that step
    (bench/programs/rank_fault.py)."""
    command = [sys.executable, "-m", "tarantella.launcher", "-n", str(devices)]
    if fault:
        command += ["--elastic"]
    if options.hostfile:
        command += ["--hostfile", options.hostfile]
    if options.npernode:
        command += ["--npernode", str(options.npernode)]
    if options.launch_agent:
        command += ["--launch-agent", options.launch_agent]
    if options.network_interface:
        command += ["--network-interface", options.network_interface]
    if options.timeline_dir:  # Note [Timeline files] in tarantella/timeline/session.py
        command += ["--timeline", os.path.join(options.timeline_dir,
                                               f"{options.model}_{options.framework}_x{devices}.json")]
    command += ["-x", "TF_CPP_MIN_LOG_LEVEL=2", "--", PROGRAM, "--model", options.model,
                "--framework", options.framework, "--global-batch", str(micro_batch * devices),
                "--steps", str(options.steps), "--warmup-steps", str(options.warmup_steps),
                "--data", options.data, "--seed", str(options.seed), "--precision", options.precision]
    if options.data_dir:
        command += ["--data-dir", options.data_dir]
    if options.input_sharding == "after-decode":   # Note [Sharding after the decode]
        command += ["--decode-for-ranks", str(devices)]
    if profile_out:
        command += ["--profile-out", profile_out]
    if fault:
        command += ["--kill-rank-at", str(fault[0]), "--fault-record", fault[1]]
    return command


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_point(options: SweepOptions, devices: int, micro_batch: int,
              profile_out: str | None = None, on_step: Callable[[str], None] | None = None,
              fault: tuple[int, str] | None = None) -> dict:
    """The program's result on `devices` ranks, plus `command` and `elapsed_s`; `on_step` gets the
    program's per-step progress ("step 3/12 (timed) 0.45 s") while it runs."""
    command = launch_command(options, devices, micro_batch, profile_out, fault)
    started = time.monotonic()

    def progress_line(line: str) -> None:
        if on_step is not None and line.startswith(PROGRESS_TAG):
            on_step(line[len(PROGRESS_TAG):])

    try:
        process = run_launched(command, options.timeout_s, progress_line)
    except LaunchTimedOut as timed_out:
        raise SweepRunError(f"the run on {devices} device(s) took longer than {options.timeout_s:.0f} s "
                            f"and was stopped; raise --timeout or lower --steps. Last output:\n"
                            f"{_tail(timed_out.stderr)}") from None
    stdout, stderr = process.stdout, process.stderr
    if process.returncode == _FRAMEWORK_MISSING:
        said = [line.split("train_benchmark: ", 1)[1] for line in stderr.splitlines()
                if "train_benchmark: " in line]
        raise BenchUsageError(said[-1] if said else "the benchmark program cannot run this framework")
    result = parse_result_line(stdout)
    if process.returncode != 0 or result is None:
        raise SweepRunError(f"the run on {devices} device(s) failed with exit code "
                            f"{process.returncode}; command: {' '.join(command)}\n{_tail(stderr)}")
    result["command"] = " ".join(command)
    result["elapsed_s"] = time.monotonic() - started
    return result


def measured_row(result: dict, oversubscribed: bool) -> dict:
    times = result["step_times_s"]
    versions = result.get("versions", {})
    row = {
        "devices": result["ranks"], "nodes": result["nodes"],
        "devices_per_node": -(-result["ranks"] // result["nodes"]), "simulated": False,
        "cluster": "", "oversubscribed": oversubscribed, "micro_batch": result["micro_batch"],
        "global_batch": result["global_batch"], "data": result["data"],
        "warmup_steps": result["warmup_steps"], "steps": result["steps"],
        "step_time_median_s": statistics.median(times), "step_time_mean_s": statistics.fmean(times),
        "step_time_min_s": min(times), "step_time_max_s": max(times),
        "step_time_std_s": statistics.pstdev(times), "step_times_s": times,
        "threads_per_rank": result["threads_per_rank"], "parameters": result["parameters"],
        "final_loss": result["final_loss"], "command": result["command"],
        **({"load_average_1m": result["load_average_1m"]} if "load_average_1m" in result else {}),
        **{key: versions.get(key) for key in ("python", "tensorflow", "keras", "tarantella", "numpy", "mpi")},
    }
    row.update(input_fields(result.get("input_alone_s"), row["step_time_median_s"]))   # Note [Input-bound]
    row["not_quiet_because"] = not_quiet_because(row)   # Note [A quiet machine] in bench/quiet.py
    row["quiet"] = not row["not_quiet_because"]
    return row
