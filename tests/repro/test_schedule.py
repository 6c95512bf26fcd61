"""Runs side by side (repro/schedule.py, Note [Runs side by side]): a run starts once the run it reads has
started and while the ranks in flight fit the cores; results come back in the plan's order; stopping early stops
the runs in flight."""
import threading
import time

from repro.runs import RunResult, RunSpec
from repro.schedule import in_plan_order


def _plan():
    # tolerance mode on 1 and 2 devices with the unseeded runs, as repro/check.py plans it
    spec = lambda name, devices: RunSpec(name, devices, "role", {}, devices > 1)  # noqa: E731
    plan = [spec("serial", 1), spec("1 device", 1), spec("2 devices", 2), spec("2 devices (repeat)", 2),
            spec("calibration", 1), spec("as written 1", 1), spec("as written 2", 1)]
    needs = {"1 device": "serial", "2 devices": "serial", "2 devices (repeat)": "serial", "calibration": "serial"}
    return plan, needs


class _Recorder:
    def __init__(self, seconds=0.05, slow=()):
        self.seconds = seconds
        self.slow = set(slow)     # runs that take 30 s unless stopped
        self.lock = threading.Lock()
        self.events = []          # (time, "start" | "end", name, devices)
        self.stopped = []

    def __call__(self, spec, stop):
        with self.lock:
            self.events.append((time.monotonic(), "start", spec.name, spec.devices))
        if stop.wait(30 if spec.name in self.slow else self.seconds):
            self.stopped.append(spec.name)
        with self.lock:
            self.events.append((time.monotonic(), "end", spec.name, spec.devices))
        return RunResult(spec, "/nowhere", 0, self.seconds, [])

    def in_flight_peak(self):
        peak, now = 0, 0
        for _, kind, _, devices in sorted(self.events):
            now += devices if kind == "start" else -devices
            peak = max(peak, now)
        return peak

    def time_of(self, kind, name):
        return next(t for t, k, n, _ in self.events if k == kind and n == name)


def test_runs_start_after_their_reference_within_the_cores_and_return_in_plan_order():
    plan, needs = _plan()
    recorder = _Recorder()
    names = [result.spec.name for result in in_plan_order(plan, needs, 2, recorder)]
    assert names == [spec.name for spec in plan]
    assert recorder.in_flight_peak() == 2                          # side by side, never beyond 2 cores
    for name, reference in needs.items():
        assert recorder.time_of("start", name) >= recorder.time_of("start", reference)
    # a 1-device run reads the reference while it runs (Note [Reading a reference while it runs])
    assert recorder.time_of("start", "1 device") < recorder.time_of("end", "serial")
    assert recorder.time_of("start", "2 devices") >= recorder.time_of("end", "1 device")   # 1 + 2 > 2 cores


def test_a_run_never_starts_before_the_reference_it_reads():
    """The reference comes later in the plan than its reader: the reader waits for it to start, even with
    cores free, so that its master rank never waits for steps of a run that has not begun."""
    spec = lambda name, devices: RunSpec(name, devices, "role", {}, devices > 1)  # noqa: E731
    plan = [spec("calibration", 1), spec("serial (production)", 1)]
    recorder = _Recorder()
    list(in_plan_order(plan, {"calibration": "serial (production)"}, 4, recorder))
    assert recorder.time_of("start", "calibration") >= recorder.time_of("start", "serial (production)")


def test_one_job_runs_the_plan_one_run_after_the_other():
    plan, needs = _plan()
    recorder = _Recorder(seconds=0.01)
    list(in_plan_order(plan, needs, 1, recorder))
    assert [kind for _, kind, _, _ in sorted(recorder.events)] == ["start", "end"] * len(plan)
    assert [name for _, kind, name, _ in sorted(recorder.events) if kind == "start"] == [s.name for s in plan]


def test_stopping_early_stops_the_runs_in_flight():
    plan, _ = _plan()
    recorder = _Recorder(seconds=0.01, slow=["as written 2"])
    started = time.monotonic()
    ordered = in_plan_order(plan[-2:], {}, 2, recorder)   # both start at once
    assert next(ordered).spec.name == "as written 1"
    ordered.close()                                         # as a check that stops at a failed run
    assert recorder.stopped == ["as written 2"] and time.monotonic() - started < 10
