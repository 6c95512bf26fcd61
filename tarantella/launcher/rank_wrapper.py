"""The small supervisor that runs around every rank's program.

The launcher does not ask mpirun (or srun) to start the user's program directly;
it starts this file on every rank, which then starts the program as its child:

    mpirun ... python .../tarantella/launcher/rank_wrapper.py [options] -- program args

Per rank, it
  * sets the default thread counts (OMP_NUM_THREADS, TF_NUM_INTRAOP_THREADS,
    TF_NUM_INTEROP_THREADS) that are not already in the environment
    (Note [Thread defaults]);
  * binds the program to its local rank's share of the host's cores when the
    launcher asks (--bind-cores; Note [Binding each rank to its share of the cores]);
  * writes a start record (Note [Start records]);
  * puts the numactl prefix of its local rank in front of the program when the
    launcher asked for pinning (--local-rank-prefix, one per local rank);
  * shows, silences or prefixes the program's output (Note [Which output is shown]);
  * keeps the last lines of the program's stderr and, when the program ends with a
    non-zero code or a signal, writes one exit record line to its own stderr
    (Note [Exit records]); the launcher's supervisor reads the first one and names
    that rank as the root cause;
  * forwards the signals it receives to the program, stops the program when its own
    parent (mpirun's daemon or srun) disappears, and exits the way the program did
    (same exit code, or the same signal), so that MPI sees the program's own status.

It is run by path, with the interpreter the launcher runs under, and imports only
the standard library: importing the `tarantella` package would load the engine in
every wrapper process. It must therefore stay one self-contained file.

Note [Which output is shown]
  Without flags, only the master rank (rank 0) is heard: its stdout and stderr pass
  through unchanged; the stdout of the other ranks is discarded and their stderr is
  kept back (its last lines appear in the failure report if the rank fails).
  --output-on-all-devices shows stdout and stderr of every rank, and
  --log-on-all-devices shows the stderr (where logs go) of every rank. As soon as
  more than the master's output is shown, every shown line of every rank, the
  master's included, starts with "[rank] " so that lines can be told apart.

Note [Exit records]
  One line on the wrapper's stderr: EXIT_RECORD_MARKER followed by a JSON object
  (rank, size, local_rank, host, pid, exit_code, signal, cause, command,
  stderr_tail, stderr_shown, end_time: when the program ended, wall clock). It
  travels the way all rank output travels (mpirun, srun and MPICH's hydra all
  forward stderr to the launcher), so it needs no shared
  file system between hosts. It is written in a single write, after the program's
  own output. cause is "failed" when the program ended with a non-zero code or a
  signal on its own, "stopped" when it ended so after this wrapper forwarded it a
  terminating signal (the MPI stopping the job because another rank failed, or the
  user pressing Ctrl-C) or lost its parent, and "finished" when it exited with 0
  (rank, size, local_rank, host, pid, exit_code 0, no signal, end_time). The finished
  records tell a job whose every rank ended from one whose mpirun exited 0 after
  its ranks were killed without a word: a node that Slurm removed from a
  --no-kill job takes its daemon's step, and mpirun then ends the others and
  exits 0 (supervisor.py, JobEnd.unreported).

Note [Start records]
  The first thing a wrapper writes to its stderr is one line: START_RECORD_MARKER
  and {"rank", "host"}. The launcher's supervisor counts them: a job whose mpirun
  ends, or that runs longer than the launch timeout, before every rank announced
  itself could not start on some host (an unreachable host, a failing launch
  agent, a wrong network), and is reported as such, naming the hosts (launch_check.py).

Note [Binding each rank to its share of the cores]
  Outside Slurm and unless told otherwise (--bind-to none, or --pin-to-socket,
  which binds whole sockets with numactl), the launcher passes --bind-cores, and
  local rank i of L runs on the i-th of L equal blocks of the physical cores of
  its affinity mask (cores in the order of their socket and core number, every
  hardware thread of a core with it; the remainder of an uneven split unused),
  as mpirun's --map-by slot:PE=C --bind-to core would place it. Its threads then
  stay on its own cores: TensorFlow's compute thread, its inter-op threads and
  the engine's progress thread take turns on them, where unbound the kernel may
  put two ranks' compute threads on one core while the progress threads, which
  poll while a transfer is awaited, take the other. Measured on the 2-core
  machine, `tarantella -n 2` against `tarantella -n 2 --bind-to none`, A/B pairs
  in one sitting (bench/pipeline/program.py): a 2-stage 1F1B pipeline of
  8 x Dense(512) at M = 8, global batch 128, median 6784 against 6418 samples/s
  (5 pairs; the waits inside the step 1-1.5 ms shorter per stage in each);
  data parallelism on the same model 6902-7232 against 5428-6372 (3 pairs);
  the pipeline of 8 x Dense(2048) medians 455 against 448 (5 pairs).
  Not bound: a rank alone on its host (it keeps the whole mask),
  more local ranks than cores (a share would be less than a core), a local rank
  count the MPI does not say, and Slurm, where binding is srun's (--cpu-bind)
  and a rank's mask may already be its task's.

Note [Thread defaults]
  Each rank gets its share of the CPUs it may run on: the CPUs of its affinity
  mask divided by the ranks on its node (at least 1); bound to its share of the
  cores, the CPUs of that share. With pinning, the launcher
  passes --threads-per-rank (the CPUs of one NUMA node), because the numactl
  binding applies to the program, not to this wrapper; inside a Slurm allocation it
  passes SLURM_CPUS_PER_TASK (sbatch -c), the CPUs the allocation gives each task.
  TF_NUM_INTEROP_THREADS is 2 where a rank's share is two CPUs or more: inter-op
  threads mostly dispatch kernels, two let independent ops of a step run at once,
  and more would compete with the intra-op threads for the share. Where the share
  is one CPU it is 1: two threads there only take turns on that CPU, and an op
  that became ready on the second waited for the first to be descheduled, up to a
  scheduler slice. Measured on the 2-core machine, `tarantella -n 2` (bound, one
  CPU each), TF_NUM_INTEROP_THREADS=2 against 1, A/B pairs in one sitting
  (bench/pipeline/program.py): the send of a 2-stage pipeline's first activation
  posted 2-5 ms after its forward pass ended, against at once (8 x Dense(2048),
  global batch 128); samples/s of the 1F1B pipeline at M = 8 15092-15891 against
  17334-17836 (8 x Dense(512), batch 1024, 3 pairs), 9153-9440 against
  10434-10603 (the same at batch 128, 2 pairs), 538-559 against 582-644
  (8 x Dense(2048), batch 128, 2 pairs); data parallelism on 8 x Dense(512) at
  batch 128 7381-7382 against 7700-7771 (2 pairs), on ResNet-50 and a Transformer
  block (bench/programs/data_parallel_modes.py, 2 ranks, micro-batch 16) the same
  within the noise: ResNet-50 1553-1641 against 1477-1672 ms a step, the
  Transformer 227-228 against 225-229 ms (3 pairs, results/thread_defaults/).
  What one thread changes: TensorFlow's executor keeps the last expensive op that
  became ready on its thread and queues the others until that chain of ops ends,
  so independent branches run one after the other, depth first. A short branch's
  gradient is then handed in after a long branch's (tests/timeline/
  test_timeline_multirank.py runs with two threads for that reason), and a send
  whose input waits in that queue is posted after the chain
  (tests/pipeline/programs/check_p2p_ops.py). One thread always finishes a step:
  the transfer, gradient and in-graph sum ops are asynchronous kernels (Note [An
  in-graph sum does not hold the framework's thread] in
  csrc/engine/graph_allreducer.hpp), and the one blocking op, the sparse-gradient
  gather, waits for the step's transfers first (Note [A blocking gather waits for
  the step's transfers] in tarantella/step/sparse_gradients.py).
  A variable that is already set (in the launcher's environment or given with -x)
  is never changed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_RECORD_MARKER = "@@tarantella-rank-exit@@ "
START_RECORD_MARKER = "@@tarantella-rank-start@@ "
STDERR_TAIL_LINES = 40
STDERR_TAIL_CHARS = 3000
THREAD_VARIABLES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
INTEROP_THREADS = 2
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_PARENT_POLL_SECONDS = 1.0
_STOP_GRACE_SECONDS = 5.0
# A stopped program seen running again this long was resumed; sooner, the job's end may have continued it.
_RESUMED_SECONDS = 3.0


class RankIdentity:
    """Where this process sits in the job, read from the variables the MPI sets."""

    def __init__(self, rank: int, size: int | None, local_rank: int, local_size: int | None):
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size


def _first_int(environ, names):
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def _slurm_local_size(environ) -> int | None:
    """Ranks on this node from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    layout = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    node = _first_int(environ, ("SLURM_NODEID",))
    if not layout or node is None:
        return None
    counts: list[int] = []
    try:
        for part in layout.split(","):
            if "(x" in part:
                count, repeat = part.rstrip(")").split("(x")
                counts.extend([int(count)] * int(repeat))
            else:
                counts.append(int(part))
    except ValueError:
        return None
    return counts[node] if node < len(counts) else None


def rank_identity(environ) -> RankIdentity:
    """Open MPI (OMPI_COMM_WORLD_*), MPICH/hydra (PMI_*, MPI_LOCAL*), Slurm (SLURM_*)."""
    rank = _first_int(environ, ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"))
    size = _first_int(environ, ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"))
    local_rank = _first_int(environ, ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                      "SLURM_LOCALID"))
    local_size = _first_int(environ, ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"))
    if local_size is None:
        local_size = _slurm_local_size(environ)
    rank = 0 if rank is None else rank
    if local_rank is None:
        local_rank = rank if local_size is None else rank % local_size
    return RankIdentity(rank, size, local_rank, local_size)


def interop_threads(threads: int) -> int:
    """TF_NUM_INTEROP_THREADS for a rank of `threads` intra-op threads (Note [Thread defaults])."""
    return INTEROP_THREADS if threads > 1 else 1


def thread_defaults(environ, cpus: int, ranks_sharing: int | None,
                    threads_per_rank: int | None = None) -> dict[str, str]:
    """The thread variables to add; see Note [Thread defaults]."""
    if threads_per_rank is None:
        threads_per_rank = cpus // max(1, ranks_sharing or 1)
    threads = max(1, threads_per_rank)
    omp, intra, inter = THREAD_VARIABLES
    wanted = {omp: str(threads), intra: str(threads), inter: str(interop_threads(threads))}
    return {name: value for name, value in wanted.items() if name not in environ}


def _core_of(cpu: int) -> tuple[int, int]:
    """(socket, core) of a CPU, from sysfs; (0, cpu) where it does not say."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as package, open(base + "core_id") as core:
            return int(package.read()), int(core.read())
    except (OSError, ValueError):
        return 0, cpu


def core_share(cpus, local_rank: int, local_size: int | None, core_of=_core_of) -> list[int] | None:
    """The CPUs of local rank `local_rank`'s share of the cores of `cpus`, or None where it is not bound
    (Note [Binding each rank to its share of the cores])."""
    if not local_size or local_size < 2 or not 0 <= local_rank < local_size:
        return None
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        cores.setdefault(core_of(cpu), []).append(cpu)
    if local_size > len(cores):
        return None
    per_rank = len(cores) // local_size
    mine = [cores[key] for key in sorted(cores)][local_rank * per_rank:(local_rank + 1) * per_rank]
    return sorted(cpu for core in mine for cpu in core)


def child_command(program: list[str], local_rank: int, prefixes: list[str]) -> list[str]:
    """The program with the numactl prefix of this local rank in front (if pinning)."""
    if not prefixes:
        return list(program)
    if local_rank >= len(prefixes):
        raise _PinningError(
            f"local rank {local_rank} has no socket to be pinned to: this host has "
            f"{len(prefixes)} NUMA node(s) with CPUs as seen by the launcher; run at most "
            f"{len(prefixes)} rank(s) per node (--npernode) or drop --pin-to-socket")
    return shlex.split(prefixes[local_rank]) + list(program)


class _PinningError(Exception):
    pass


def _encode_record(marker: str, record: dict) -> bytes:
    return (marker + json.dumps(record, separators=(",", ":")) + "\n").encode()


def _decode_record(marker: str, text: str) -> dict | None:
    """The record in a line that starts with `marker`, or None if it is damaged."""
    if not text.startswith(marker):
        return None
    try:
        record = json.loads(text[len(marker):])
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("rank"), int) else None


def encode_exit_record(record: dict) -> bytes:
    return _encode_record(EXIT_RECORD_MARKER, record)


def decode_exit_record(text: str) -> dict | None:
    return _decode_record(EXIT_RECORD_MARKER, text)


def encode_start_record(rank: int, host: str) -> bytes:
    """The line announcing that a rank's wrapper runs (Note [Start records])."""
    return _encode_record(START_RECORD_MARKER, {"rank": rank, "host": host})


def decode_start_record(text: str) -> dict | None:
    return _decode_record(START_RECORD_MARKER, text)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[written:]


class _Pump(threading.Thread):
    """Copies one output pipe of the program, line by line, to `target_fd` (or nowhere),
    prefixing each line, and keeps the last lines when `tail` is given."""

    def __init__(self, source, target_fd: int | None, prefix: bytes,
                 tail: collections.deque | None):
        super().__init__(daemon=True)
        self.source, self.target_fd, self.prefix, self.tail = source, target_fd, prefix, tail

    def run(self) -> None:
        for line in iter(self.source.readline, b""):
            if self.tail is not None:
                self.tail.append(line)
            if self.target_fd is not None:
                if not line.endswith(b"\n"):
                    line += b"\n"
                _write_all(self.target_fd, self.prefix + line)
        self.source.close()


def _prepare_child(share: list[int] | None) -> None:
    """Runs in the child before exec: its share of the cores (inherited by every thread it starts) and
    the parent death signal."""
    if share is not None:
        os.sched_setaffinity(0, share)
    if os.environ.get("TNT_ELASTIC_DIR"):
        # An elastic job's resize request (tarantella/elastic/__init__.py: RESIZE_SIGNAL_NAME) is ignored until
        # tnt.Model.fit handles it; the launcher asks again until the ranks leave.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _set_parent_death_signal()


def _set_parent_death_signal() -> None:
    """Runs in the child before exec: the program gets SIGKILL if this wrapper dies."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the parent watch below still stops the program
        pass


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rank_wrapper.py", allow_abbrev=False)
    parser.add_argument("--output", choices=("master", "all"), default="master",
                        help="whose stdout is shown")
    parser.add_argument("--errors", choices=("master", "all"), default="master",
                        help="whose stderr is shown")
    parser.add_argument("--local-rank-prefix", action="append", default=[],
                        help="command put in front of the program on local rank i (i-th use)")
    parser.add_argument("--threads-per-rank", type=int, default=None)
    parser.add_argument("--bind-cores", action="store_true",
                        help="run the program on this local rank's share of the host's cores")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("no program given")
    return args


class _Stop:
    """Signals received by the wrapper; forwarded to the program."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.stopping_signal: int | None = None
        # Since when the program has been stopped (SIGSTOP), looked at every second: one stopped when the job
        # ended had hung. The job's end may continue it first (the MPI sends SIGCONT to the whole process group,
        # then SIGTERM), so a stop counts until the program was seen running for _RESUMED_SECONDS.
        self.stopped_since: float | None = None
        self.stopped_seen = 0.0
        self.stopped_for = 0.0
        self.identity: dict | None = None   # rank, host, ... for a record

    def look(self, state: str | None) -> None:
        """The program's state, every second. While it is stopped, its record is kept on the host at once:
        the job's end may kill this wrapper too (Note [Elastic generations] in elastic.py)."""
        now = time.monotonic()
        if state in ("T", "t"):
            self.stopped_since, self.stopped_seen = self.stopped_since or now, now
            if self.stopping_signal is None and self.identity is not None:
                _keep_record({**self.identity, "exit_code": None, "signal": None, "cause": "stopped",
                              "stopped_for": round(self.stopped_seconds(), 1), "end_time": time.time()})
        elif self.stopped_since is not None and self.stopping_signal is None and \
                now - self.stopped_seen > _RESUMED_SECONDS:
            self.stopped_since = None
            if self.identity is not None:
                _keep_record(None, self.identity)

    def stopped_seconds(self) -> float:
        return self.stopped_for if self.stopped_since is None else time.monotonic() - self.stopped_since

    def handle(self, signum, _frame) -> None:
        if signum in _STOPPING_SIGNALS and self.stopping_signal is None:
            self.stopping_signal = signum
            if self.stopped_since is not None:
                self.stopped_for = time.monotonic() - self.stopped_since
                if self.identity is not None:   # kept at once: the job's end may not let this wrapper finish
                    _keep_record({**self.identity, "exit_code": 128 + signum, "signal": None, "cause": "stopped",
                                  "stopped_for": round(self.stopped_for, 1), "end_time": time.time()})
        if self.child is not None and self.child.returncode is None:
            try:
                self.child.send_signal(signum)
            except ProcessLookupError:
                pass


def _keep_record(record: dict | None, identity: dict | None = None) -> None:
    """An elastic job's ranks also keep their exit record in a file of their host (TNT_ELASTIC_DIR: the names
    in tarantella/elastic/__init__.py), where the launcher reads it if the stream lost it: the MPI may end the
    job before a remote rank's output arrives (Note [Elastic generations] in elastic.py). None removes the
    record of the rank `identity`."""
    root = os.environ.get("TNT_ELASTIC_DIR")
    if not root:
        return
    who = record or identity
    try:
        here = os.path.join(root, "records", who["host"])
        path = os.path.join(here, f"gen-{os.environ.get('TNT_ELASTIC_GENERATION', '1')}-rank-{who['rank']}.rec")
        if record is None:
            if os.path.exists(path):
                os.remove(path)
            return
        os.makedirs(here, exist_ok=True)
        with open(path + ".tmp", "wb") as handle:
            handle.write(encode_exit_record(record))
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _process_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _watch_parent(stop: _Stop, parent: int) -> None:
    """Stops the program when the wrapper's parent (mpirun's daemon, srun) is gone,
    e.g. because mpirun was killed with SIGKILL and could not stop its ranks."""
    while stop.child is not None and stop.child.returncode is None:
        time.sleep(_PARENT_POLL_SECONDS)
        stop.look(_process_state(stop.child.pid))
        if os.getppid() != parent:
            if stop.stopping_signal is None:
                stop.stopping_signal = signal.SIGTERM
            try:
                stop.child.terminate()
                time.sleep(_STOP_GRACE_SECONDS)
                stop.child.kill()
            except ProcessLookupError:
                pass
            return


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    me = rank_identity(os.environ)
    host = socket.gethostname()
    _write_all(2, encode_start_record(me.rank, host))
    is_master = me.rank == 0
    show_stdout = is_master or args.output == "all"
    show_stderr = is_master or args.output == "all" or args.errors == "all"
    prefixed = args.output == "all" or args.errors == "all"
    prefix = f"[{me.rank}] ".encode() if prefixed else b""

    env = dict(os.environ)
    mask = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    share = core_share(mask, me.local_rank, me.local_size) if args.bind_cores else None
    if share is None:
        env.update(thread_defaults(env, len(mask), me.local_size, args.threads_per_rank))
    else:
        env.update(thread_defaults(env, len(share), 1, args.threads_per_rank))

    tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
    stop = _Stop()
    stop.identity = {"rank": me.rank, "size": me.size, "local_rank": me.local_rank, "host": socket.gethostname(),
                     "pid": os.getpid()}
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, stop.handle)
    parent = os.getppid()

    ended_at: list[float] = []  # when the program ended (wall clock, for the root cause)

    def finish(exit_code: int, signum: int | None, command: list[str]) -> int:
        end_time = ended_at[0] if ended_at else time.time()
        if exit_code == 0:
            _write_all(2, encode_exit_record({**stop.identity, "exit_code": 0, "signal": None, "cause": "finished",
                                              "end_time": end_time}))
            if stop.stopped_since is not None:   # a stop it came back from
                _keep_record(None, stop.identity)
        else:
            cause = "stopped" if stop.stopping_signal is not None else "failed"
            text = b"".join(tail).decode("utf-8", "replace")[-STDERR_TAIL_CHARS:]
            record = {**stop.identity, "exit_code": exit_code, "signal": signum, "cause": cause, "command": command,
                      "stderr_tail": text, "stderr_shown": show_stderr, "stopped_for": round(stop.stopped_seconds(), 1),
                      "end_time": end_time}
            _write_all(2, encode_exit_record(record))
            _keep_record(record)
        return exit_code

    try:
        command = child_command(args.program, me.local_rank, args.local_rank_prefix)
    except _PinningError as error:
        message = f"tarantella: error: rank {me.rank} on host {host}: {error}\n"
        tail.append(message.encode())
        _write_all(2, (prefix + message.encode()) if show_stderr else b"")
        return finish(2, None, list(args.program))

    if not show_stdout:
        stdout = subprocess.DEVNULL
    else:  # unprefixed: the program writes straight into the wrapper's stdout
        stdout = subprocess.PIPE if prefixed else None
    try:
        child = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE,
                                 preexec_fn=lambda: _prepare_child(share))
    except OSError as error:
        message = (f"tarantella: error: rank {me.rank} on host {host} cannot run "
                   f"{command[0]!r}: {error.strerror}\n")
        tail.append(message.encode())
        _write_all(2, prefix + message.encode())  # always shown: nothing else will be
        return finish(127 if isinstance(error, FileNotFoundError) else 126, None, command)
    stop.child = child
    if stop.stopping_signal is not None:  # a signal arrived before the child existed
        child.send_signal(stop.stopping_signal)

    pumps = [_Pump(child.stderr, 2 if show_stderr else None, prefix, tail)]
    if child.stdout is not None:
        pumps.append(_Pump(child.stdout, 1, prefix, None))
    for pump in pumps:
        pump.start()
    threading.Thread(target=_watch_parent, args=(stop, parent), daemon=True).start()

    returncode = child.wait()
    ended_at.append(time.time())
    for pump in pumps:
        pump.join(timeout=2.0)  # a grandchild may still hold the pipe open
    if returncode >= 0:
        return finish(returncode, None, command)

    signum = -returncode
    finish(128 + signum, signum, command)
    _end_by_signal(signum)
    return 128 + signum


def _end_by_signal(signum: int) -> None:
    """End the way the program ended, so that the MPI reports the signal too (without
    leaving a core file of this wrapper behind)."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: cannot be caught anyway
        pass
    os.kill(os.getpid(), signum)


if __name__ == "__main__":
    sys.exit(main())
