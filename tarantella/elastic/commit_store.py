"""Where an elastic job keeps its commits, and how one is written and read (Note [Elastic commits]).

Note [Elastic commits]
A commit is the training state at a step boundary: every variable the step changes (weights, BatchNormalization
statistics, random generators' states, the optimizer's), the metrics' running state, and the position in the
data (epoch, batches done in it). An elastic job's next generation (Note [Elastic generations] in
tarantella/launcher/elastic.py) starts from the newest commit, so it trains on exactly where the lost one
stood: nothing trained twice, nothing skipped.

The state is named (Note [A commit by name] in committing.py), and each name is written on every host by the
lowest rank there that holds it, into the commit directory the launcher gives every rank (TNT_ELASTIC_DIR, by
default in /dev/shm: memory, which outlives the processes but not the host). Data parallelism keeps the whole
state on every rank, so a host's lowest rank writes all of it and every host holds a full copy: any surviving
host can restore it. A sharded model's ranks each hold a share (their optimizer slots; with shard="weights"
their weights too), so each rank writes its own, and a commit is whole where the shares of all its names are
found. Each rank writes a part of its own (ROOT/HOST/gen<G>-rank-<R>), and the copy of a peer's share it keeps
as another (gen<G>-copy-of-rank-<R>), so ranks and hosts that share a file system (--commit-dir) never write the
same file, and a generation never writes into a part of another.

Two slots per host take turns: a commit overwrites the older slot in place (its memory is already there:
a plain copy, where a new file of /dev/shm would first be given its pages), and is valid once its meta.json
exists. The slot's meta.json is removed before its data is overwritten and written (renamed into place) after,
so a rank lost in the middle of a commit leaves the other slot, the previous commit, readable. Commits are
ordered by (fit call, global step, generation); a fit call never overwrites a commit of a later one (a restarted
program runs its earlier fit calls again; the fit call the commit belongs to restores it). The generation tells
apart a step committed twice: begun by a generation that was lost in its middle, and trained again by the next
one, whose ranks hold other shares.
"""
from __future__ import annotations

import json
import os
import socket

import numpy as np

from tarantella.elastic import COMMIT_DIR_VARIABLE

__all__ = ["directory", "write", "newest", "on_this_host", "read_arrays", "Meta"]

# {"fit": int, "global_step": int, "generation": int, "part": str, "epoch": int, "batches_done": int, "count": int,
#  "layout": [...], ...}
Meta = dict
_SLOTS = ("slot-0", "slot-1")
_DEFAULT_PART = "gen1-rank-0"


def directory() -> str | None:
    """This job's commit directory, or None when the job is not elastic."""
    return os.environ.get(COMMIT_DIR_VARIABLE) or None


def order(meta: Meta) -> tuple[int, int, int]:
    return int(meta["fit"]), int(meta["global_step"]), int(meta.get("generation", 1))


def _host_dir(root: str) -> str:
    return os.path.join(root, socket.gethostname())


def _commits(part_dir: str) -> list[tuple[tuple[int, int, int], str, Meta]]:
    """The valid commits of one part, oldest first."""
    found = []
    for slot in _SLOTS:
        path = os.path.join(part_dir, slot)
        try:
            with open(os.path.join(path, "meta.json"), encoding="utf-8") as handle:
                meta = json.load(handle)
        except (OSError, ValueError):
            continue
        found.append((order(meta), path, meta))
    return sorted(found, key=lambda item: item[0])


def newest(root: str, part: str = _DEFAULT_PART) -> tuple[Meta, str] | None:
    """The newest complete commit of a part on this host: (its meta, its path), or None."""
    commits = _commits(os.path.join(_host_dir(root), part))
    return (commits[-1][2], commits[-1][1]) if commits else None


def on_this_host(root: str) -> list[tuple[Meta, str]]:
    """Every complete commit of every part on this host: [(its meta, its path)]."""
    try:
        parts = sorted(os.listdir(_host_dir(root)))
    except OSError:
        return []
    return [(meta, path) for part in parts for _, path, meta in _commits(os.path.join(_host_dir(root), part))]


def write(root: str, arrays: list[np.ndarray], meta: Meta) -> bool:
    """Writes a commit into the older slot of its part (meta["part"]; Note [Elastic commits]); False (nothing
    written) when the part holds a commit of a later fit call. The arrays go into one raw file, back to back."""
    part_dir = os.path.join(_host_dir(root), meta.get("part", _DEFAULT_PART))
    commits = _commits(part_dir)
    if commits and commits[-1][0][0] > int(meta["fit"]):
        return False
    newest_path = commits[-1][1] if commits else None
    slot = next(os.path.join(part_dir, name) for name in _SLOTS if os.path.join(part_dir, name) != newest_path)
    os.makedirs(slot, exist_ok=True)
    try:
        os.remove(os.path.join(slot, "meta.json"))   # invalid from here until the new meta is in place
    except FileNotFoundError:
        pass
    layout, offset = [], 0
    data = os.path.join(slot, "arrays.bin")
    with open(data, "r+b" if os.path.exists(data) else "wb") as handle:
        for array in arrays:
            layout.append({"dtype": array.dtype.str, "shape": list(np.shape(array)), "offset": offset})
            flat = np.ascontiguousarray(array).reshape(-1)
            handle.write(memoryview(flat).cast("B") if flat.size else b"")
            offset += flat.nbytes
        handle.truncate(offset)
    with open(os.path.join(slot, "meta.tmp"), "w", encoding="utf-8") as handle:
        json.dump({**meta, "count": len(arrays), "layout": layout}, handle)
    os.rename(os.path.join(slot, "meta.tmp"), os.path.join(slot, "meta.json"))
    return True


def read_arrays(path: str, count: int | None = None, indices=None) -> list[np.ndarray]:
    """The commit's first `count` arrays, or those at `indices`."""
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as handle:
        layout = json.load(handle)["layout"]
    entries = [layout[i] for i in indices] if indices is not None else layout[:count]
    arrays = []
    with open(os.path.join(path, "arrays.bin"), "rb") as handle:
        for entry in entries:
            handle.seek(entry["offset"])
            array = np.empty(entry["shape"], dtype=np.dtype(entry["dtype"]))
            if array.size:
                handle.readinto(memoryview(array.reshape(-1)).cast("B"))
            arrays.append(array)
    return arrays
