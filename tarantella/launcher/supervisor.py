"""Runs the job's command and watches its ranks; reports the first failure.

How a failure is found and reported:
  1. Every rank runs under rank_wrapper.py. When a rank's program ends, its wrapper
     writes one exit record line to stderr (rank, host, exit code or signal, the
     tail of the program's stderr, and the cause: "failed" on its own, "stopped" by
     a signal from outside, or "finished" with 0). A job whose mpirun exits 0 while
     a rank that started sent no record did not succeed: its ranks were killed
     without a word (Note [Exit records]).
  2. The MPI forwards that line with the rest of the ranks' stderr to this
     process, which reads mpirun's stderr, takes the records out, and passes every
     other byte through unchanged. When the first record with cause "failed"
     arrives, a line is printed at once naming it. The root cause in the final
     report is the failed rank whose program ended first (records carry the time),
     which is not always the first record to arrive.
  3. Open MPI, MPICH and srun (--kill-on-bad-exit=1) end the whole job when one
     rank exits non-zero. If the job is still running GRACE_SECONDS after the
     root cause arrived, the supervisor stops it: SIGTERM to mpirun, SIGKILL
     KILL_AFTER_SECONDS later (wrappers whose mpirun is gone stop their program
     within a second).
  4. A launch that fails before every rank started (a host that cannot be
     reached, a failing launch agent) is reported in one line naming the host,
     with exit code 2 (launch_check.py); so is a launch not complete within the
     launch timeout, after which the job is stopped.
  5. When the job has ended, the report is printed (root cause first: rank, host,
     exit code or signal, the last lines of its stderr; then the other ranks), and
     the launcher exits with the root cause's exit code: the code the program
     exited with, or 128 + N for a program killed by signal N.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from .launch_check import LAUNCH_FAILED, LaunchProgress
from .rank_wrapper import (EXIT_RECORD_MARKER, START_RECORD_MARKER, decode_exit_record,
                           decode_start_record)

__all__ = ["run_job", "run_generation", "JobEnd", "describe_end", "failure_report", "root_cause", "GRACE_SECONDS"]

GRACE_SECONDS = 4.0       # the MPI usually ends the job within a second of a failure
KILL_AFTER_SECONDS = 2.0
_MARKER = EXIT_RECORD_MARKER.encode()
_START_MARKER = START_RECORD_MARKER.encode()
_LISTED = 8
_POLL_SECONDS = 1.0  # how soon a signal to the launcher is acted on
# Once mpirun ended, its pipes are read to their end; a process that outlived it and still holds them (a daemon
# on a host mpirun cannot reach any more) is not waited for longer than this after the last output came.
_QUIET_AFTER_END_SECONDS = 0.5


def describe_end(record: dict) -> str:
    if record.get("signal"):
        number = record["signal"]
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"was killed by {name} (signal {number}; exit code {record['exit_code']})"
    return f"exited with code {record['exit_code']}"


def _where(record: dict) -> str:
    return f"rank {record['rank']} (host {record.get('host', '?')})"


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit|Interrupt)\b.*)$")
_CAUSE_CHARS = 240


def exception_summary(stderr_tail: str | None) -> str | None:
    """The last `SomeError: message` line of a rank's stderr (module path dropped), so
    that the report's first line says why the rank failed."""
    for line in reversed((stderr_tail or "").splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            text = match.group(1)
            return text if len(text) <= _CAUSE_CHARS else text[:_CAUSE_CHARS - 3] + "..."
    return None


def root_cause(records: list[dict]) -> dict | None:
    """The failed rank whose program ended first. Not simply the first record to
    arrive: a rank killed from outside and its peer that lost it both fail within
    milliseconds, and the peer's record may travel faster (Note [Exit records])."""
    failed = [record for record in records if record.get("cause") == "failed"]
    if not failed:
        return None
    return min(failed, key=lambda record: record.get("end_time", float("inf")))


def _listed(items: list) -> str:
    """The first _LISTED items, and ", ..." when there are more."""
    return ", ".join(str(item) for item in items[:_LISTED]) + (", ..." if len(items) > _LISTED else "")


def failure_report(first: dict, records: list[dict]) -> str:
    size = f" of {first['size']}" if first.get("size") else ""
    cause = exception_summary(first.get("stderr_tail"))
    lines = [f"tarantella: error: rank {first['rank']}{size} failed first: it "
             f"{describe_end(first)} on host {first.get('host', '?')}"
             + (f": {cause}" if cause else ""),
             f"  root cause : rank {first['rank']}{size}, local rank "
             f"{first.get('local_rank', '?')}, host {first.get('host', '?')}, "
             f"pid {first.get('pid', '?')}",
             f"  command    : {' '.join(first.get('command') or [])}"]
    tail = (first.get("stderr_tail") or "").rstrip("\n")
    if tail:
        shown = "" if first.get("stderr_shown") else " (not shown above: only the master rank's is)"
        lines.append(f"  stderr     : last {len(tail.splitlines())} line(s){shown}:")
        lines += [f"    | {line}" for line in tail.splitlines()]
    else:
        lines.append("  stderr     : (empty)")
    others_failed = [r for r in records if r is not first and r.get("cause") == "failed"]
    stopped = sorted(r["rank"] for r in records if r.get("cause") == "stopped")
    for record in others_failed[:_LISTED]:
        lines.append(f"  later      : {_where(record)} {describe_end(record)}")
    if len(others_failed) > _LISTED:
        lines.append(f"  later      : {len(others_failed) - _LISTED} more rank(s) failed")
    if stopped:
        lines.append(f"  stopped    : {len(stopped)} rank(s) ended by the MPI or the launcher "
                     f"after the failure ({_listed(stopped)})")
    return "\n".join(lines)


class _StderrWatcher(threading.Thread):
    """Reads mpirun's stderr: passes output through, collects exit records."""

    def __init__(self, pipe, on_first_failure, launch: LaunchProgress | None = None,
                 verbose: bool = False):
        super().__init__(daemon=True)
        self.pipe = pipe
        self.launch = launch
        self.verbose = verbose  # held-back output of a failed launch is shown too
        self.then = "stopping the job"  # what the first failure's notice says happens next
        self.quiet = False              # output read for the records only
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.started: dict[int, str] = {}   # rank -> host, from the start records
        self.first_failure: dict | None = None
        self._on_first_failure = on_first_failure
        self._at_line_start = True
        self.last_output = time.monotonic()   # of either stream

    @property
    def at_line_start(self) -> bool:
        return self._at_line_start

    def _write(self, data: bytes) -> None:
        self.last_output = time.monotonic()
        if data and not self.quiet:
            self._at_line_start = data.endswith(b"\n")
            _emit(sys.stderr, data)

    def _release_locked(self) -> None:
        held = self.launch.release()
        _emit(sys.stdout, held["out"])
        self._write(held["err"])

    def passes(self, data: bytes, stream: str) -> None:
        """Output of mpirun and the ranks: held back while the launch is under way."""
        self.last_output = time.monotonic()
        with self.lock:
            if self.launch is not None and self.first_failure is None and \
                    self.launch.hold(data, stream):
                return
            if self.launch is not None:
                self._release_locked()
            if stream == "err":
                self._write(data)
            else:
                _emit(sys.stdout, data)

    def _pass(self, data: bytes) -> None:
        self.passes(data, "err")

    def _start_record(self, line: bytes) -> bool:
        at = line.find(_START_MARKER)
        record = decode_start_record(line[at:].decode("utf-8", "replace").rstrip("\n")) \
            if at >= 0 else None
        if record is None:
            return False
        if at > 0:
            self._pass(line[:at])
        self.started[record["rank"]] = record.get("host", "?")
        if self.launch is not None:
            with self.lock:
                self.launch.rank_started(record)
                if self.launch.complete:
                    self._release_locked()
        return True

    def release_held(self) -> None:
        if self.launch is not None:
            with self.lock:
                self._release_locked()

    def run(self) -> None:
        for line in iter(self.pipe.readline, b""):
            if self._start_record(line):
                continue
            at = line.find(_MARKER)
            record = decode_exit_record(line[at:].decode("utf-8", "replace").rstrip("\n")) \
                if at >= 0 else None
            if record is None:
                self._pass(line)
                continue
            if at > 0:
                self._pass(line[:at])  # another rank's unfinished line; it continues later
            self.records.append(record)
            if record.get("cause") == "failed" and self.first_failure is None:
                self.first_failure = record
                self.release_held()
                notice = f"tarantella: {_where(record)} {describe_end(record)}; {self.then}\n"
                self._write((b"" if self._at_line_start else b"\n") + notice.encode())
                self._on_first_failure(record)
        self.pipe.close()


def _emit(stream, data: bytes) -> None:
    if not data:
        return
    try:
        stream.flush()
        stream.buffer.write(data)
        stream.buffer.flush()
    except (AttributeError, ValueError):  # a stream without a buffer (captured in tests)
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()
    except BrokenPipeError:
        pass


def _drain(readers: list[threading.Thread], watcher: _StderrWatcher, longest: float) -> None:
    """Waits for the readers of mpirun's pipes to reach their end, at most `longest` seconds, and no longer
    than _QUIET_AFTER_END_SECONDS after the last output: orphans (a daemon on a host mpirun could not reach)
    may hold the pipes open, and everything mpirun wrote is in them once it ended. (Both pipes waited for 5 s
    each had cost a job that lost a host's link 10 s before it knew.)"""
    ended = time.monotonic()
    while any(reader.is_alive() for reader in readers) and time.monotonic() - ended < longest and \
            time.monotonic() - max(ended, watcher.last_output) < _QUIET_AFTER_END_SECONDS:
        time.sleep(0.02)


def _pump_stdout(pipe, watcher: _StderrWatcher) -> None:
    """mpirun's stdout, passed on as it comes (held back while the launch is under way)."""
    while True:
        data = os.read(pipe.fileno(), 1 << 16)
        if not data:
            break
        watcher.passes(data, "out")
    pipe.close()


def _descendants(pid: int) -> list[int]:
    """Processes below pid (Linux /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _start_time(pid: int) -> str | None:
    """The kernel's start time of pid (field 22 of /proc/PID/stat): tells a process from a later one
    that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class _LaunchedProcesses:
    """Every process mpirun started on this machine while the ranks start. A launch that
    fails can leave daemons behind on the hosts mpirun did reach (started through their
    agents on this machine), out of mpirun's tree: Open MPI's prted daemonizes at once
    (its parent becomes init), often between two looks at the tree. So they are also
    found by the job's PRRTE namespace on their command line, `prterun-HOST-PID@`, which
    names mpirun's host and pid (mpirun execs prterun)."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, str | None] = {}
        self.namespace = f"prterun-{socket.gethostname()}-{root}@".encode()

    def look(self) -> None:
        for pid in _descendants(self.root):
            self.seen.setdefault(pid, _start_time(pid))

    def _of_this_job(self) -> None:
        for entry in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if self.namespace in handle.read():
                        self.seen.setdefault(int(entry), _start_time(int(entry)))
            except OSError:
                continue

    def kill_survivors(self) -> None:
        self._of_this_job()
        for pid, started in self.seen.items():
            if started is not None and _start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _stop_tree(process: subprocess.Popen, kill_after: float) -> None:
    """Stops mpirun when it does not end by itself (a stuck launch, a job it could not
    end after a failure) and everything it started on this host: its launch agents
    (ssh clients) run in process groups of their own, and a killed mpirun leaves them."""
    below = _descendants(process.pid)
    _stop(process, kill_after)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop(process: subprocess.Popen, kill_after: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        process.kill()


@dataclasses.dataclass
class JobEnd:
    """How one mpirun ended: what run_job reports, and what an elastic job decides from (launcher/elastic.py)."""
    returncode: int                 # mpirun's, 128 + N for a signal
    records: list[dict]             # the ranks' exit records
    started: dict[int, str]         # rank -> host, from the start records
    interrupted: list[int]          # signals that told the launcher to stop
    launch_failure: str | None      # the one line of a launch that failed, else None
    forced: bool                    # the launcher had to stop mpirun after a failure
    grace_seconds: float
    command: str
    reported: bool = False          # mpirun could not even be started: the one line is printed already

    @property
    def unreported(self) -> dict[int, str]:
        """rank -> host of the ranks that started and sent no exit record (Note [Exit records])."""
        ended = {record["rank"] for record in self.records}
        return {rank: host for rank, host in self.started.items() if rank not in ended}

    @property
    def first(self) -> dict | None:
        return root_cause(self.records) or next((r for r in self.records if r.get("cause") == "failed"), None)

    def report(self) -> int:
        """Prints how the job ended (the module docstring) and returns the launcher's exit code."""
        if self.reported:
            return self.returncode
        if self.launch_failure is not None:
            print(self.launch_failure, file=sys.stderr, flush=True)
            return LAUNCH_FAILED
        first = self.first
        if self.forced and first is not None:
            print(f"tarantella: the MPI had not ended the job {self.grace_seconds:g} s after "
                  f"{_where(first)} failed; the launcher stopped it", file=sys.stderr)
        if first is not None:
            print(failure_report(first, self.records), file=sys.stderr, flush=True)
            return first["exit_code"]
        if self.interrupted:
            print(f"tarantella: stopped by {signal.Signals(self.interrupted[0]).name}", file=sys.stderr)
            return 128 + self.interrupted[0]
        if self.returncode == 0 and self.unreported:
            ranks = sorted(self.unreported)
            hosts = sorted(set(self.unreported.values()))
            print(f"tarantella: error: {self.command} exited with 0, but rank(s) {_listed(ranks)} on host(s) "
                  f"{_listed(hosts)} never reported their end: the MPI or the batch system ended them (a node lost "
                  f"or removed from the job?)", file=sys.stderr, flush=True)
            return 1
        if self.returncode != 0:
            print(f"tarantella: error: the job ended with exit code {self.returncode} and no rank "
                  f"reported a failure of its program; the message above from {self.command} says why "
                  f"(for example, the ranks could not be started)", file=sys.stderr, flush=True)
        return self.returncode


def run_job(argv: list[str], **options) -> int:
    """Runs argv to its end and returns the job's exit code (see the module docstring)."""
    return run_generation(argv, **options).report()


def run_generation(argv: list[str], *, env: dict | None = None, grace_seconds: float = GRACE_SECONDS,
                   kill_after_seconds: float = KILL_AFTER_SECONDS, launch: LaunchProgress | None = None,
                   launch_timeout: float | None = None, verbose: bool = False,
                   then: str = "stopping the job", poll=None, quiet: bool = False) -> JobEnd:
    """Runs argv to its end. With `launch`, a launch that fails or takes longer than launch_timeout seconds
    ends with one line and exit code 2 (launch_check.py). `then`: what the notice of the first failure says
    happens next; `poll(process)`: called about every second while mpirun runs (an elastic job's host
    watch); `quiet`: the ranks' output is read for their records and not passed on (an elastic job's probe)."""
    wake = threading.Event()
    failed_at: list[float] = []
    interrupted: list[int] = []

    def on_first_failure(record: dict) -> None:
        failed_at.append(time.monotonic())
        wake.set()

    try:
        process = subprocess.Popen(argv, stderr=subprocess.PIPE, env=env,
                                   stdout=subprocess.PIPE if launch is not None else None)
    except OSError as error:
        print(f"tarantella: error: cannot start {argv[0]!r}: {error.strerror}", file=sys.stderr)
        return JobEnd(127, [], {}, [], None, False, grace_seconds, argv[0], reported=True)
    started_at = time.monotonic()
    launch_timed_out = False
    watcher = _StderrWatcher(process.stderr, on_first_failure, launch, verbose)
    watcher.then, watcher.quiet = then, quiet
    watcher.start()
    stdout_pump = None
    if process.stdout is not None:
        stdout_pump = threading.Thread(target=_pump_stdout, args=(process.stdout, watcher),
                                       daemon=True)
        stdout_pump.start()
    threading.Thread(target=lambda: (process.wait(), wake.set()), daemon=True).start()

    previous = {}

    def on_signal(signum, _frame):  # touches no lock: the loop below looks every second
        interrupted.append(signum)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, on_signal)
    forced = False
    stop_asked_at: float | None = None
    launched = _LaunchedProcesses(process.pid)
    try:
        while process.poll() is None:
            if launch is not None and not launch.complete:
                launched.look()
            since = failed_at[0] if failed_at else stop_asked_at
            deadline = None if since is None else since + grace_seconds
            wake.wait(_POLL_SECONDS if deadline is None
                      else min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            wake.clear()
            if poll is not None and not failed_at and stop_asked_at is None:
                poll(process)
            if interrupted and stop_asked_at is None:
                stop_asked_at = time.monotonic()
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            if deadline is not None and time.monotonic() >= deadline and process.poll() is None:
                forced = True
                _stop_tree(process, kill_after_seconds)
            if launch is not None and launch_timeout is not None and not launch.complete and \
                    watcher.first_failure is None and stop_asked_at is None and \
                    time.monotonic() - started_at > launch_timeout:
                launch_timed_out = True
                _stop_tree(process, min(2.0, kill_after_seconds))
        process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _drain([watcher] + ([stdout_pump] if stdout_pump is not None else []), watcher,
           0.5 if forced or launch_timed_out else 5.0)

    if not watcher.at_line_start:  # the report starts a line of its own
        watcher.passes(b"\n", "err")
    returncode = process.returncode if process.returncode >= 0 else 128 - process.returncode
    first = root_cause(watcher.records) or watcher.first_failure
    end = JobEnd(returncode, list(watcher.records), dict(watcher.started), interrupted, None, forced,
                 grace_seconds, argv[0])
    if launch is not None and first is None and not interrupted and not launch.complete and \
            (launch_timed_out or returncode != 0):
        if verbose:
            watcher.release_held()
        launched.kill_survivors()
        end.launch_failure = launch.failure(None if launch_timed_out else returncode, launch_timeout)
        return end
    watcher.release_held()
    return end
