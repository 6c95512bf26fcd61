"""What the ranks of an elastic job do together to commit and restore (Note [Elastic commits] in
commit_store.py): who writes each host's copy, which commit a new generation restores and who reads it, the
writing thread, and leaving at a step's end when the launcher asks for a resize. Used by tnt.Model.fit
(fit_commits.py) and custom loops (loop_state.py).
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import threading
import time

import numpy as np

from tarantella import channels, collectives, runtime, stage_state, timeline
from tarantella.elastic import (COMMIT_EVERY_VARIABLE, GENERATION_VARIABLE, RESIZE_EXIT_CODE, RESIZE_SIGNAL_NAME,
                                commit_store)
from tarantella.timeline import session as timeline_session

__all__ = ["ResizeRequest", "resize_request", "leave_for_resize", "Writer", "commit_every", "NamedState",
           "held_by_name"]


class ResizeRequest:
    """The launcher asks the ranks (RESIZE_SIGNAL_NAME) to leave at the end of a step, so that a generation of
    another size goes on (hosts added or removed); the ranks agree on the step (a tiny allreduce per step)."""

    def __init__(self):
        self.asked = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), self._ask)
            # At exit Python puts back the default action (terminate) of a signal it handles, not of an ignored
            # one: a request that comes as the program ends (its fit done) must not kill it, or the launcher
            # would take the rank for lost.
            atexit.register(signal.signal, getattr(signal, RESIZE_SIGNAL_NAME), signal.SIG_IGN)

    def _ask(self, _signum, _frame):
        self.asked = True

    def agreed(self) -> bool:
        return bool(collectives.allreduce(np.array([int(self.asked)], dtype=np.int32), op="max")[0])


_resize = None


def resize_request() -> ResizeRequest:
    global _resize
    if _resize is None:
        _resize = ResizeRequest()
    return _resize


class Writer:
    """Writes commits on a thread of its own while the next steps run: a commit is taken when its values are
    copied out of the variables, and one write waits for the one before (they land in order)."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, root: str, parts: list[tuple[list, dict]]) -> None:
        """parts: [(arrays, meta)] of one commit, each written as a part of its own (commit_store.write)."""
        self.flush()
        taken_at = time.time()   # the timeline's resize starts there
        parts = [(arrays, {**meta, "taken_at": taken_at}) for arrays, meta in parts]
        self._thread = threading.Thread(target=self._write, args=(root, parts), daemon=True,
                                        name="tnt-elastic-commit")
        self._thread.start()

    def _write(self, root, parts):
        try:
            with timeline.span(timeline.names.ELASTIC_COMMIT, track="elastic", step=parts[0][1]["global_step"],
                               written=True):
                for arrays, meta in parts:
                    commit_store.write(root, arrays, meta)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread at the next flush
            self._error = error

    def flush(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def commit_every() -> int:
    raw = os.environ.get(COMMIT_EVERY_VARIABLE, "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"tarantella --elastic: {COMMIT_EVERY_VARIABLE}={raw!r} is not a whole number of steps "
                         f">= 1; use --commit-every 1 (every step) or more")
    return int(raw)


def _generation() -> int:
    """Which generation of the elastic job this process belongs to (the launcher sets it)."""
    return int(os.environ.get(GENERATION_VARIABLE, "1") or "1")


def _nbytes(spec: tuple) -> int:
    shape, dtype = spec
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


# Note [Copies travel in buffers made once]
# A commit's copies (Note [A commit by name]) are sent from, and received into, buffers made once, when the
# state is built: a fresh buffer each commit had every page of it faulted in as the bytes arrived, and a share
# of 67 MB then took 0.35-0.53 s to arrive instead of 0.06 s (2 namespace hosts on the 2-core machine; TCP into
# new pages). A received copy is written on the writer thread while the next step runs, so two buffers per
# sender take turns: a commit's exchange comes after the write of the commit before the last one ended
# (Writer.submit waits for the write before it).
def _copy_tag() -> int:
    """The channels' tag of the copies: the largest the MPI allows, which no other user of channels takes (they
    share the world's communicator; a pipeline's and a weight handoff's tags count from 0)."""
    return channels.max_tag()


class NamedState:
    """Note [A commit by name]
    A commit's arrays are named, the same on every rank and in every generation: "v<i>" the model's i-th
    variable, "o:<attribute>/<slot>" the state of the optimizer that attribute holds (its slot names relative
    to the model's variables: stage_state.optimizer_state_by_name), "m<i>" the i-th metric variable's state
    summed over the ranks. A rank
    holds a name when its variable has storage: every rank holds every name in data parallelism, a sharded rank
    its own optimizer slots (and with shard="weights" its own weights) beside the replicated rest. On each host
    the lowest rank holding a name writes it, so a host keeps one copy of everything its ranks hold, and the
    world's hosts together hold every name. A new generation, of any size and with other owners, restores by
    name: each name is read on the lowest rank whose host holds it in the newest commit whose names are all
    found, and broadcast; the ranks that hold it now keep it.

    A name held on one host only (a sharded rank's share) would be lost with that host, or with its rank where
    the next generation starts no rank on the host (one rank per host): each rank sends the names only its host
    writes to a peer on the next host (the rank of the same local index there), which writes them beside its
    own, as a copy. So every name is on two hosts, and a job survives the loss of any one of them.

    Built collectively, once the model and optimizers are built: `held` {name: variable} this rank holds,
    `summed` the names of the arrays every rank computes alike for each commit (the summed metric state)."""

    def __init__(self, held: dict, summed: list[str] = ()):
        self.held = held
        self.summed = list(summed)
        self.hosts = collectives.allgather_object(socket.gethostname())
        rank = runtime.get_rank()
        names_of = collectives.allgather_object(sorted(held))
        local = [r for r, host in enumerate(self.hosts) if host == self.hosts[rank]]
        self.all_names = sorted(set().union(*map(set, names_of)) | set(self.summed))
        self.host_writer = local[0] == rank
        writes_of = self._writes_of(names_of)
        self.writes = writes_of[rank]   # the held names this rank writes: those no lower rank of its host holds
        self._copies(names_of, writes_of)

    def _writes_of(self, names_of: list) -> list[list[str]]:
        """Every rank's names to write: those no lower rank of its host holds."""
        written: dict = {}
        writes = []
        for r, names in enumerate(names_of):
            here = written.setdefault(self.hosts[r], set())
            writes.append([name for name in names if name not in here])
            here.update(names)
        return writes

    def _copies(self, names_of: list, writes_of: list) -> None:
        """Who sends which names to whom, for the copy on the next host (Note [A commit by name])."""
        order = list(dict.fromkeys(self.hosts))
        ranks_on = {host: [r for r, h in enumerate(self.hosts) if h == host] for host in order}
        hosts_holding: dict = {}
        for r, names in enumerate(names_of):
            for name in names:
                hosts_holding.setdefault(name, set()).add(self.hosts[r])
        only_here = [[name for name in names if len(hosts_holding[name]) == 1] for names in writes_of]
        peer_of = {}
        if len(order) > 1:
            for r, host in enumerate(self.hosts):
                following = ranks_on[order[(order.index(host) + 1) % len(order)]]
                peer_of[r] = following[ranks_on[host].index(r) % len(following)]
        rank = runtime.get_rank()
        self.copy_names = only_here[rank] if rank in peer_of and only_here[rank] else []
        self.peer = peer_of.get(rank)
        self.copies_from = {r: names for r, names in enumerate(only_here) if names and peer_of.get(r) == rank}
        self._channels = channels.open_channels() if self.copy_names or self.copies_from else None
        specs = collectives.allgather_object({name: (tuple(self.held[name].shape), np.dtype(self.held[name].dtype).str)
                                              for name in self.copy_names})
        self.copy_specs = {r: [specs[r][name] for name in names] for r, names in self.copies_from.items()}
        # The buffers the copies travel in, made once (Note [Copies travel in buffers made once]): the one sent,
        # and two per sender received into, taking turns.
        self._sent = np.empty(sum(_nbytes(specs[rank][name]) for name in self.copy_names), np.uint8) \
            if self.copy_names else None
        self._received = {r: [np.empty(sum(map(_nbytes, specs_of)), np.uint8) for _ in range(2)]
                          for r, specs_of in self.copy_specs.items()}
        self._turn = 0

    def arrays(self, summed_values: list) -> tuple[list[str], list[np.ndarray]]:
        """What this rank writes for a commit: (names, copies of their values)."""
        names = list(self.writes) + (self.summed if self.host_writer else [])
        values = [self.held[name].numpy() for name in self.writes] + (list(summed_values) if self.host_writer
                                                                       else [])
        return names, values

    def submit(self, writer: "Writer", root: str, summed_values: list, meta: dict) -> None:
        """Hands this rank's part of a commit, and the copies its peers sent it, to its writing thread. Collective
        where names are copied: each rank sends its copy to its peer and waits for those sent to it."""
        names, values = self.arrays(summed_values)
        generation = _generation()
        meta = {**meta, "all_names": self.all_names, "generation": generation, "world_size": runtime.get_size()}
        parts = [(values, {**meta, "names": names, "part": f"gen{generation}-rank-{runtime.get_rank()}"})] \
            if names else []
        for source, (copies, copy_names) in self._exchange_copies(dict(zip(names, values))).items():
            parts.append((copies, {**meta, "names": copy_names, "part": f"gen{generation}-copy-of-rank-{source}"}))
        if parts:
            writer.submit(root, parts)

    def _exchange_copies(self, values: dict) -> dict:
        """Sends this rank's names held on its host only to its peer; {source rank: (arrays, names)} received."""
        if self._channels is None:
            return {}
        handles = []
        if self.copy_names:
            np.concatenate([np.ascontiguousarray(values[name]).reshape(-1).view(np.uint8) for name in self.copy_names],
                           out=self._sent)
            handles.append(self._channels.send(self.peer, _copy_tag(), self._sent))
        received = {}
        for source, specs in self.copy_specs.items():
            sizes = [_nbytes(spec) for spec in specs]
            buffer = self._received[source][self._turn]
            handles.append(self._channels.receive(source, _copy_tag(), buffer))
            received[source] = (buffer, sizes)
        self._turn = 1 - self._turn
        for handle in handles:
            handle.wait()
        copies = {}
        for source, (buffer, sizes) in received.items():
            arrays, offset = [], 0
            for (shape, dtype), size in zip(self.copy_specs[source], sizes):
                arrays.append(buffer[offset:offset + size].view(np.dtype(dtype)).reshape(shape))
                offset += size
            copies[source] = (arrays, self.copies_from[source])
        return copies

    def restore(self, root: str, fit_index: int) -> tuple[dict, dict] | None:
        """Collective, as a generation starts: None when no commit of this fit call exists; else (the commit's
        meta, {name: value} of the names this rank holds and of the summed ones) from the newest commit whose
        names are all found on the hosts (Note [A commit by name]). Assigns nothing."""
        timeline_session.join_generation(_generation())
        started, rank = time.perf_counter(), runtime.get_rank()
        found = [(meta, path) for meta, path in commit_store.on_this_host(root) if int(meta["fit"]) == fit_index] \
            if self.host_writer else []
        offers = collectives.allgather_object([(commit_store.order(meta), meta["names"], meta["all_names"],
                                                [(entry["shape"], entry["dtype"]) for entry in meta["layout"]])
                                               for meta, _ in found])
        if not any(offers):
            return None
        holder, specs = {}, {}   # order -> {name: the lowest rank whose host offers it}; name -> (shape, dtype)
        for r, offered in enumerate(offers):
            for key, names, _, layout in offered:
                for name, spec in zip(names, layout):
                    holder.setdefault(tuple(key), {}).setdefault(name, r)
                    specs.setdefault(name, spec)
        wanted = {tuple(key): set(all_names) for offered in offers for key, _, all_names, _ in offered}
        whole = [key for key in holder if wanted[key] <= set(holder[key])]
        if not whole:
            newest = max(holder)
            raise RuntimeError(f"tarantella --elastic: no commit of this fit call is whole on the hosts left (the "
                               f"newest, step {newest[1]}, lacks {len(wanted[newest] - set(holder[newest]))} of its "
                               f"arrays: they were on the hosts lost); commit to a file system every host reads "
                               f"with --commit-dir DIR")
        key = max(whole)
        owners = holder[key]
        if set(self.held) - set(owners):
            raise ValueError(f"tarantella --elastic: the commit holds {len(owners)} arrays, this program has "
                             f"{len(set(self.held) - set(owners))} variables (or metric states) more to restore: "
                             f"it builds another model or optimizer than the one committed")
        mine = {}   # the arrays this rank reads, each from the first part of the commit on its host that holds it
        for meta, path in found:
            if commit_store.order(meta) == key:
                indices = [i for i, name in enumerate(meta["names"]) if owners[name] == rank and name not in mine]
                mine.update(zip([meta["names"][i] for i in indices], commit_store.read_arrays(path, indices=indices)))
        first = min(owners.values())
        meta = collectives.broadcast_object(next((m for m, _ in found if commit_store.order(m) == key), None)
                                            if rank == first else None, root=first)
        values = {}
        with timeline.span(timeline.names.ELASTIC_RESTORE, track="elastic", step=int(meta["global_step"]),
                           world_size=int(meta["world_size"])):
            for name in sorted(owners):
                shape, dtype = specs[name]
                buffer = mine.pop(name) if owners[name] == rank else np.empty(shape, np.dtype(dtype))
                value = collectives.broadcast(np.ascontiguousarray(buffer), root=owners[name])
                if name in self.held or name in self.summed:
                    values[name] = np.array(value, copy=True).reshape(shape)
        self._resize_span(meta)
        return {**meta, "readers": sorted(set(owners.values())), "seconds": time.perf_counter() - started}, values

    @staticmethod
    def _resize_span(meta: dict) -> None:
        """From the commit taken to the new generation holding it: steps lost and the restart."""
        if "taken_at" in meta:
            now = time.monotonic()
            timeline.complete(timeline.names.ELASTIC_RESIZE, now - max(0.0, time.time() - float(meta["taken_at"])),
                              now, track="elastic", step=int(meta["global_step"]),
                              world_size_before=int(meta["world_size"]), world_size=runtime.get_size(),
                              generation=_generation())

    def assign(self, values: dict) -> None:
        """Sets the held variables to the restored values."""
        for name, variable in self.held.items():
            variable.assign(values[name])


def held_by_name(model_variables: list, optimizers: dict, extra: list = ()) -> dict:
    """{name: variable} with storage on this rank (Note [A commit by name]): "v<i>" the model's variables, then
    "<key>/<slot>" the state of each optimizer of `optimizers` {key: optimizer} (slots named by the model's
    variables they belong to), then "x<i>" any `extra` variable not among those."""
    named = {f"v{i}": variable for i, variable in enumerate(model_variables)}
    for key, optimizer in optimizers.items():
        named.update({f"{key}/{name}": variable for name, variable in
                      stage_state.optimizer_state_by_name(optimizer, model_variables).items()})
    seen = {id(variable) for variable in named.values()}
    named.update({f"x{i}": variable for i, variable in enumerate(extra) if id(variable) not in seen})
    return {name: variable for name, variable in named.items() if not stage_state.is_released(variable)}


def leave_for_resize(writer: Writer, step: int) -> None:
    """Every rank at the same step (ResizeRequest.agreed): none waits for another in MPI_Finalize."""
    if runtime.is_master_rank():
        print(f"tarantella: elastic: the job's hosts changed; every rank leaves after step {step}, committed, "
              f"for a generation of the new size", flush=True)
    # Asked again while leaving, the process must not die of it: Python restores the signal's default action
    # (terminate) at exit for handlers it set, not for an ignored signal.
    signal.signal(getattr(signal, RESIZE_SIGNAL_NAME), signal.SIG_IGN)
    timeline_session.leave_generation()
    writer.flush()
    raise SystemExit(RESIZE_EXIT_CODE)
