"""Elastic jobs (tarantella --elastic --min-ranks M): a job that loses ranks goes on with the survivors.

Note [Elastic generations]
An MPI world cannot lose a member and go on, so an elastic job runs as generations, each one mpirun over the
ranks there are. When a generation ends because ranks were lost, the launcher drops them and starts the next
generation on the rest; its ranks restore the newest commit (Note [Elastic commits] in
tarantella/elastic/commit_store.py) and train on from it, with the same global batch: a resize changes who
computes, not what is computed.

Which ranks were lost, from the ranks' exit records (supervisor.py):
  - a rank whose program was killed by a signal nobody in the job sent (SIGKILL, the OOM killer);
  - a rank whose program was found stopped (SIGSTOP) when the job ended: it hung;
  - a rank its peers' collectives timed out waiting for ("... waiting for rank 3"), unless it timed out
    itself: then it was alive, waiting too (so was a rank the MPI aborted on finding a lost peer's sockets
    closed);
  - every rank of a host from which no record came and on which no rank can be started any more: the host,
    or its network, is gone.
The MPI may end a generation before a remote rank's record reaches the launcher, so in a generation on
several hosts every rank also keeps its record in a file of its host, and a probe job of one rank per host
(as the next generation would start, through the MPI and over the network) reads them back and says which
hosts can still start a rank. A rank killed alone gives up its slot; a host that went silent is dropped
whole. A program that fails on its own (an exception that is not a lost peer's) ends the job as it would
without --elastic: it would fail again. Fewer than --min-ranks left also ends it, naming what was lost.

Growing (and shrinking on purpose): while a generation runs, the launcher reads the job's hosts every
--discovery-interval seconds (host_discovery.py). When they change, it asks the ranks to leave at the end of a
step (RESIZE_SIGNAL_NAME, sent again every interval until they do: a rank ignores it until its fit can take
it); they agree on the step, commit and exit with RESIZE_EXIT_CODE, and the next generation runs on the new
hosts (at most --max-ranks ranks). A host lost earlier comes back the same way: when the hosts change again.

A generation after the first, and a probe, whose mpirun exits at start-up before any rank ran is launched
again (up to _START_ATTEMPTS times): the hosts were just running ranks, and mpirun is known to fail so now
and then (Note [A launch that started no rank is retried once] in launch_check.py). The first generation's
launch failure is the user's (a wrong host, agent or network) and is reported at once, as without --elastic.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time

from tarantella.elastic import (COMMIT_DIR_VARIABLE, COMMIT_EVERY_VARIABLE, GENERATION_VARIABLE, RESIZE_EXIT_CODE,
                                RESIZE_SIGNAL_NAME)

from .host_discovery import HostSource
from .launch_check import LAUNCH_FAILED, LaunchProgress, no_rank_started
from .launch_plan import LaunchPlan
from .mpirun_command import build_command
from .supervisor import JobEnd, describe_end, exception_summary, run_generation

__all__ = ["Loss", "find_loss", "survivors", "resized", "capped", "run_elastic", "commit_directory"]


# The engine's timeout names the ranks it waited for (csrc/engine/process_group.cpp, describe_ranks); "one or
# more of ranks ..." names no one in particular and is not taken as a loss.
_MISSING = re.compile(r"timed out after \d+ s waiting for ranks? (\d+(?:, \d+)*)")
_PEER_ERRORS = ("CollectiveTimeoutError", "GroupFailedError", "MpiError")
# Open MPI's TCP transport, on finding a peer's sockets closed (the peer killed), aborts the rank that finds it
# outside any communicator's error handler ("An error occurred in Socket closed ... on a NULL communicator ...
# MPI_ERRORS_ARE_FATAL"), before the engine sees anything: that rank is a victim of the loss, not a culprit.
_PEER_GONE_IN_MPI = re.compile(r"An error occurred in Socket closed|peer process has unexpectedly disconnected")
_GRACE_SECONDS = 2.0
# A generation's (or a probe's) mpirun that did not end by itself gets this long after SIGTERM before SIGKILL,
# not a plain job's 2 s: what its ranks did is committed, and a probe has nothing to keep. Under Slurm, mpirun
# waits on the srun of a lost node's daemon, and the two 2 s waits were 4 of a recovery's 27.5 s.
_KILL_AFTER_SECONDS = 0.5
_START_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class Loss:
    ranks: dict[int, str]           # lost rank -> why
    silent_hosts: frozenset[int]    # positions in the placement of hosts from which nothing came


def _placement(plan: LaunchPlan, started: dict[int, str]) -> list[tuple[str, int]]:
    """(host, ranks on it) in rank order: the plan's hosts, else the hosts the ranks said they ran on."""
    if plan.hosts:
        return list(plan.hosts)
    placed: list[tuple[str, int]] = []
    for rank in range(plan.nranks):
        host = started.get(rank, "?")
        if placed and placed[-1][0] == host:
            placed[-1] = (host, placed[-1][1] + 1)
        else:
            placed.append((host, 1))
    return placed


def _host_index(placement: list[tuple[str, int]]) -> dict[int, int]:
    index, rank = {}, 0
    for position, (_, count) in enumerate(placement):
        for _ in range(count):
            index[rank] = position
            rank += 1
    return index


def find_loss(end: JobEnd, plan: LaunchPlan, probe=None) -> Loss | None:
    """The ranks a failed generation lost (Note [Elastic generations]); None when it lost none, or when a
    program failed on its own. `probe(hosts) -> (the hosts a rank can be started on, the exit records kept
    there)`: a job the MPI ended may have lost the output of live hosts."""
    placement = _placement(plan, end.started)
    host_of = _host_index(placement)
    records = list(end.records)
    alive = None
    if probe is not None:
        alive, kept = probe([host for host, _ in placement])
        arrived = {record["rank"] for record in records}
        records += [record for record in kept if record["rank"] not in arrived and record["rank"] in host_of]
    by_rank = {record["rank"]: record for record in records}
    reporting = {host_of.get(record["rank"]) for record in records}
    silent = {position for position in range(len(placement)) if position not in reporting}
    if alive is not None:
        silent = {position for position in silent if placement[position][0] not in alive}
    # A rank that timed out itself was there to do so; the ranks it waited for may only have been waiting too.
    # (Its record may say "stopped": the MPI ended it as it raised.)
    waited = {record["rank"] for record in records
              if (exception_summary(record.get("stderr_tail")) or "").startswith(_PEER_ERRORS)
              or _PEER_GONE_IN_MPI.search(record.get("stderr_tail") or "")}
    lost: dict[int, str] = {}
    for rank in range(plan.nranks):
        record = by_rank.get(rank)
        if record is None:
            if host_of.get(rank) in silent:
                lost[rank] = "sent nothing: its host or the host's network is gone"
        elif record.get("stopped_for", 0) > 0:
            lost[rank] = f"was stopped (SIGSTOP) for {record['stopped_for']:g} s and hung"
        elif record.get("cause") == "failed" and record.get("signal"):
            lost[rank] = describe_end(record)
    # Whom a timeout names counts only when nothing names a culprit outright: in a chain of waits (0 waits for
    # 1, which waits for the stopped 2) the MPI may end rank 1 before it times out itself.
    named = {}
    for record in records:
        for match in _MISSING.finditer(record.get("stderr_tail") or ""):
            for rank in map(int, match.group(1).split(", ")):
                if rank not in waited:
                    named.setdefault(rank, f"its peers timed out waiting for it (rank {record['rank']} said so)")
    if not lost:
        lost = named
    # A program failed on its own when its stderr ends in an exception of its own. A rank that shows none was
    # ended by the MPI: on losing a peer, Open MPI aborts the rank that found it and then the job (exit code 14
    # for every rank it ended so, with a message in one rank's stderr at most).
    for record in records:
        own = exception_summary(record.get("stderr_tail"))
        if record.get("cause") == "failed" and record["rank"] not in lost and own and not own.startswith(_PEER_ERRORS):
            return None
    return Loss(lost, frozenset(silent)) if lost else None


def resized(end: JobEnd) -> bool:
    """Every rank that ended on its own left for a resize (RESIZE_EXIT_CODE), none was lost."""
    failed = [record for record in end.records if record.get("cause") == "failed"]
    return bool(failed) and all(record.get("exit_code") == RESIZE_EXIT_CODE and not record.get("signal")
                                for record in failed)


def survivors(plan: LaunchPlan, end: JobEnd, loss: Loss) -> list[tuple[str, int]]:
    """The placement of the next generation: silent hosts dropped whole, each other lost rank's slot given up."""
    placement = _placement(plan, end.started)
    host_of = _host_index(placement)
    counts = [count for _, count in placement]
    for rank in loss.ranks:
        position = host_of.get(rank)
        if position is not None and position not in loss.silent_hosts:
            counts[position] -= 1
    return [(host, count) for position, ((host, _), count) in enumerate(zip(placement, counts))
            if position not in loss.silent_hosts and count > 0]


def commit_directory(given: str | None) -> str:
    """Where the ranks keep their commits: the given directory, else one of this job's in /dev/shm (memory)."""
    if given:
        return os.path.abspath(given)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"tnt-elastic-{socket.gethostname()}-{os.getpid()}")


def _generation_plan(plan: LaunchPlan, placement: list[tuple[str, int]] | None, generation: int,
                     commit_dir: str) -> LaunchPlan:
    rank_env = dict(plan.rank_env)
    rank_env[COMMIT_DIR_VARIABLE] = commit_dir
    rank_env[GENERATION_VARIABLE] = str(generation)
    if placement is None:
        return dataclasses.replace(plan, rank_env=rank_env)
    nranks = sum(count for _, count in placement)
    rank_env["TNT_WORLD_SIZE"] = str(nranks)
    most = max(count for _, count in placement)
    # Inside a Slurm allocation the next generation names its hosts too: the MPI would otherwise place it on
    # the allocation's nodes as the job started with them (SLURM_JOB_NODELIST), a lost one included.
    return dataclasses.replace(plan, nranks=nranks, hosts=tuple(placement) if plan.hosts or plan.in_slurm else (),
                               ranks_per_host=most if plan.ranks_per_host is not None else None,
                               rank_env=rank_env)


def _remove_commits(plan: LaunchPlan, hosts: list[str], launcher, local_host, commit_dir: str) -> None:
    """The commits are not needed once the job ended: removed on this host, and on the last generation's other
    `hosts` by a job of one `rm` per host (a lost host keeps its copy: nothing reaches it)."""
    shutil.rmtree(commit_dir, ignore_errors=True)
    if not hosts or (not plan.hosts and len(hosts) == 1):   # one host (this one, or Slurm's one node)
        return
    cleaner = dataclasses.replace(plan, nranks=len(hosts), hosts=tuple((host, 1) for host in hosts),
                                  ranks_per_host=1, program=("rm", "-rf", commit_dir), pin_prefixes=(),
                                  output_all=False, errors_all=False)
    run_generation(build_command(cleaner, launcher, local_host), grace_seconds=2.0)


def _probe(plan: LaunchPlan, launcher, local_host, directory: str, generation: int, hosts: list[str],
           seconds: float = 3.0) -> tuple[set[str], list[dict]]:
    """A job of one rank per host, through the MPI, as the next generation would start (over the network: a
    host whose link is gone cannot start its daemon): which hosts can start a rank now, and the exit records
    the ranks of `generation` kept on them (rank_wrapper.py `_keep_record`), which the stream may have lost."""
    kept = os.path.join(directory, "records")
    show = (f'cat "{kept}/$(hostname)"/gen-{generation}-rank-*.rec 1>&2 2>/dev/null; exit 0')
    probe = dataclasses.replace(plan, nranks=len(hosts), hosts=tuple((host, 1) for host in hosts), ranks_per_host=1,
                                program=("sh", "-c", show), pin_prefixes=(), output_all=False, errors_all=True,
                                rank_env={k: v for k, v in plan.rank_env.items() if k != COMMIT_DIR_VARIABLE})
    for _ in range(_START_ATTEMPTS):
        progress = LaunchProgress(probe.nranks, probe.hosts, probe.launch_agent)
        end = run_generation(build_command(probe, launcher, local_host), launch=progress, launch_timeout=seconds,
                             grace_seconds=1.0, kill_after_seconds=_KILL_AFTER_SECONDS, quiet=True)
        if not _started_none(end):
            break
    # The probe's own ranks' records say "finished"; a rank of the generation keeps only a failed or stopped one.
    return {hosts[rank] for rank in end.started}, [record for record in end.records
                                                   if record.get("cause") != "finished"]


def _started_none(end: JobEnd) -> bool:
    """mpirun exited at start-up before any rank ran (not a launch that timed out: a host that is gone)."""
    return end.launch_failure is not None and bool(no_rank_started(LAUNCH_FAILED, end.launch_failure))


def _describe(loss: Loss, plan: LaunchPlan, end: JobEnd) -> str:
    placement = _placement(plan, end.started)
    host_of = _host_index(placement)
    return "; ".join(f"rank {rank} (host {placement[host_of[rank]][0] if rank in host_of else '?'}) {why}"
                     for rank, why in sorted(loss.ranks.items()))


class _HostWatch:
    """Reads the job's hosts every `interval` seconds while a generation runs, and asks its ranks to leave
    for a resize while the hosts differ from the last ones taken."""

    def __init__(self, source: HostSource, interval: float, taken: tuple | None):
        self.source, self.interval = source, interval
        self.seen = taken          # the hosts as last read
        self.wanted = None         # hosts the job should run on next, once the ranks left
        self._next = time.monotonic() + interval

    def poll(self, process) -> None:
        if not self.source.dynamic or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        now = self.source.hosts()
        if now is not None and now != self.seen:
            self.seen = self.wanted = now
            print(f"tarantella: elastic: the job's hosts are now {', '.join(f'{h}:{c}' for h, c in now)}; "
                  f"the ranks leave at the end of a step for a generation on them", file=sys.stderr, flush=True)
        if self.wanted is not None and process.poll() is None:
            process.send_signal(getattr(signal, RESIZE_SIGNAL_NAME))   # mpirun passes it to the ranks


def capped(hosts, max_ranks: int | None) -> list[tuple[str, int]]:
    placed, left = [], max_ranks if max_ranks else sum(count for _, count in hosts)
    for host, count in hosts:
        if left <= 0:
            break
        placed.append((host, min(count, left)))
        left -= min(count, left)
    return placed


def run_elastic(plan: LaunchPlan, launcher, local_host, *, min_ranks: int, max_ranks: int | None,
                commit_dir: str | None, commit_every: int | None, source: HostSource, interval: float,
                launch_timeout: float | None, verbose: bool) -> int:
    """Runs generations until one ends without losing ranks or leaving for a resize (Note [Elastic
    generations])."""
    directory = commit_directory(commit_dir)
    if commit_every is not None:
        plan = dataclasses.replace(plan, rank_env={**plan.rank_env, COMMIT_EVERY_VARIABLE: str(commit_every)})
    generation, current = 1, _generation_plan(plan, None, 1, directory)
    ran_on = [host for host, _ in current.hosts]   # the hosts of the last generation, whose commits are removed
    watch = _HostWatch(source, interval, source.hosts())
    attempt = 1
    try:
        while True:
            command = build_command(current, launcher, local_host)
            progress = LaunchProgress(current.nranks, current.hosts, current.launch_agent)
            # A shorter grace than a plain job's: the MPI cannot end a generation that lost a host's daemon.
            end = run_generation(command, launch=progress, launch_timeout=launch_timeout, verbose=verbose,
                                 then="ending this generation of the elastic job", poll=watch.poll,
                                 grace_seconds=_GRACE_SECONDS, kill_after_seconds=_KILL_AFTER_SECONDS)
            ended_at = time.monotonic()
            ran_on = [host for host, _ in _placement(current, end.started) if host != "?"]
            if generation > 1 and attempt < _START_ATTEMPTS and _started_none(end) and not end.interrupted:
                attempt += 1
                print(f"tarantella: elastic: generation {generation} started no rank "
                      f"({end.launch_failure.removeprefix('tarantella: error: ')}); "
                      f"launching it again (attempt {attempt} of {_START_ATTEMPTS})", file=sys.stderr, flush=True)
                continue
            attempt = 1
            # No rank failed, yet the job did not succeed: the MPI may have ended it on losing a host's daemon
            # before any rank timed out, or exited 0 after Slurm removed a node (its ranks sent no end);
            # find_loss asks which hosts are gone.
            if end.launch_failure or end.interrupted or (end.first is None and end.returncode == 0
                                                         and not end.unreported):
                return end.report()
            if resized(end) and watch.wanted is not None:
                placement, why = capped(watch.wanted, max_ranks), "the job's hosts changed"
                watch.wanted = None
            else:
                loss = find_loss(end, current, (lambda hosts: _probe(current, launcher, local_host, directory,
                                                                     generation, hosts))
                                 if current.hosts or current.in_slurm else None)
                if loss is None:
                    return end.report()
                placement, why = survivors(current, end, loss), f"lost {_describe(loss, current, end)}"
                left = sum(count for _, count in placement)
                if left < min_ranks:
                    print(f"tarantella: error: elastic job: {why}; {left} rank(s) left, fewer than --min-ranks "
                          f"{min_ranks}; the job ends", file=sys.stderr, flush=True)
                    code = end.report()
                    return code if code else 1
            generation += 1
            current = _generation_plan(current, placement, generation, directory)
            hosts = f" on {', '.join(f'{h}:{c}' for h, c in placement)}" if current.hosts else ""
            print(f"tarantella: elastic: {why}; generation {generation} goes on with {current.nranks} rank(s)"
                  f"{hosts} from the last commit ({time.monotonic() - ended_at:.1f} s after the old one ended)",
                  file=sys.stderr, flush=True)
    finally:
        _remove_commits(current, ran_on, launcher, local_host, directory)
