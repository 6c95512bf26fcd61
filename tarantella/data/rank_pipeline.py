"""A batched tf.data pipeline rewritten so that each rank does the per-sample work for its own samples only.

Note [Rewriting the user's pipeline]
A user pipeline reads, in order of application,

    prefix  ->  tail (element-wise maps, shuffle/repeat/take/skip)  ->  batch(B)
            ->  after (shuffle/repeat/take/skip/prefetch/cache)

where the prefix ends at the last "barrier" before the batch: a `filter` (which
samples survive depends on their values), a `cache` (its point is to keep what
was computed before it), or a transformation this module does not know. Every
rank becomes

    prefix -> tail's order links -> select -> tail's maps -> batch(b_r) -> after

- `select` batches the (still cheap) stream by B, keeps this rank's contiguous
  part of each global batch (tarantella/data/batching.py) and unbatches it, so
  the maps (decode, augment: the expensive part) run on about B/N samples per
  global batch instead of B. The element-wise maps commute with the order
  links (a shuffle, take or repeat moves whole elements whatever their values),
  so the global batches hold exactly serial's samples in serial's order.
- Batching the rank's samples by b_r (its share of a full global batch)
  re-forms exactly its micro-batches (Note [Selecting by blocks]). Where the
  last global batch may be partial, every selected sample carries its global
  batch's size, and a rank with no sample in a partial last batch takes one
  placeholder sample (the batch's first), cut away after batching, so that
  every rank yields the same number of micro-batches (an empty one here).
- The links after the batch act on whole batches; re-applied to the
  micro-batches (shuffles with the same seeds and fresh generators) they pick
  the same global batches on every rank. A file `cache` gets a per-rank name.

What still runs on every sample on every rank: the prefix (the source, and
maps placed before a filter or cache: a one-line warning says so) and the
`select` step's batching of the cheap pre-map elements. `padded_batch` pads
each micro-batch to its own longest sample where the padded shape is not fixed
(serial pads to the global batch's longest): give `padded_shapes` for exact
equality. Random ops in the moved maps draw per rank, as random layers do.

Pipelines that cannot be rewritten without changing which samples a batch
holds fall back to reading every global batch in full and slicing out the
rank's part (tarantella/data/distributed_dataset.py), with one warning line on
the master naming the transformation: a map/filter/unbatch/... after the
batch, a batch size that is not a constant, or no batch at all.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import zlib

import tensorflow as tf

from tarantella import runtime
from tarantella.data import batching, dataset_graph as graph, distributed_dataset
from tarantella.data.order_check import Fingerprint, batch_hash

__all__ = ["Plan", "plan", "for_rank", "unseeded_shuffles", "warn_on_master"]

logger = logging.getLogger("tarantella")

_AFTER_BATCH_KINDS = graph.ORDER_KINDS + (graph.CACHE,)
_TAIL_KINDS = graph.ORDER_KINDS + (graph.MAP,)


@dataclasses.dataclass
class Plan:
    prefix: tf.data.Dataset        # runs in full on every rank
    prefix_cache: graph.Link | None  # a file cache ending the prefix: re-applied with a per-rank file name
    order: list[graph.Link]        # order links of the tail, re-applied before the selection
    maps: list[graph.Link]         # element-wise maps of the tail, applied after the selection
    batch: graph.Link
    global_batch: int
    drop_remainder: bool
    after: list[graph.Link]        # links after the batch, re-applied to the micro-batches
    notes: list[str]               # one-line warnings: work that still runs on every sample


def plan(dataset: tf.data.Dataset) -> Plan | str:
    """How to rewrite `dataset` (a pipeline of global batches), or why it cannot be (one line)."""
    root, links = graph.transformations(dataset)
    links = [link for link in links if link.kind != graph.OPTIONS]
    batches = [i for i, link in enumerate(links) if link.kind in (graph.BATCH, graph.PADDED_BATCH)]
    if not batches:
        others = [link.name for link in links if link.kind == graph.OTHER]
        where = f" (the pipeline ends in {others[-1]})" if others else ""
        return (f"no Dataset.batch() found in the pipeline{where}: batch the samples with Dataset.batch() or "
                f"padded_batch() as the pipeline's last per-sample step")
    at = batches[-1]
    batch = links[at]
    for link in links[at + 1:]:
        if link.kind not in _AFTER_BATCH_KINDS:
            return (f"{link.name} after {batch.name} works on whole global batches; apply it before the batch "
                    f"(per sample) so that each rank runs it on its own samples only")
    global_batch = graph.static_value(batch.dataset._batch_size)
    drop = graph.static_value(batch.dataset._drop_remainder)
    if global_batch is None or drop is None:
        return f"the batch size or drop_remainder of {batch.name} is not a constant: pass Python values"
    start = at
    while start > 0 and links[start - 1].kind in _TAIL_KINDS:
        start -= 1
    tail = links[start:at]
    barrier = links[start - 1] if start > 0 else None
    prefix = barrier.dataset if barrier is not None else root
    prefix_cache = None
    if barrier is not None and barrier.kind == graph.CACHE and graph.static_value(barrier.dataset._filename):
        prefix_cache, prefix = barrier, barrier.dataset._input_dataset
    notes = []
    before = start - 1
    while before > 0 and links[before - 1].kind in _TAIL_KINDS:
        before -= 1
    early_maps = [link for link in links[before:max(start - 1, 0)] if link.kind == graph.MAP]
    if early_maps and barrier is not None and barrier.kind in (graph.FILTER, graph.CACHE):
        remedy = {graph.FILTER: "filter before the map (or on cheap fields)",
                  graph.CACHE: "cache before the map if the memory is not worth it"}[barrier.kind]
        notes.append(f"tarantella: {len(early_maps)} Dataset.map() before {barrier.name} run on every rank for "
                     f"every sample (each rank maps only its own samples after it): {remedy}")
    return Plan(prefix, prefix_cache, [link for link in tail if link.kind != graph.MAP],
                [link for link in tail if link.kind == graph.MAP], batch, int(global_batch), bool(drop),
                links[at + 1:], notes)


def unseeded_shuffles(dataset: tf.data.Dataset) -> list[str]:
    """The unseeded shuffles of the pipeline (Note [Same order on every rank] in order_check.py)."""
    _, links = graph.transformations(dataset)
    return [link.name for link in links if graph.is_unseeded_shuffle(link)]


def warn_on_master(rank: int, message: str) -> None:
    if rank == runtime.get_master_rank():
        logger.warning("%s", message)


def for_rank(dataset: tf.data.Dataset, the_plan: Plan, size: int, rank: int,
             fingerprint: Fingerprint) -> tf.data.Dataset:
    """This rank's micro-batches (distributed elements) of `dataset`, rewritten as `the_plan` says."""
    suffix = f".rank{rank}"
    cheap = the_plan.prefix
    if the_plan.prefix_cache is not None:
        cheap = graph.reapply(the_plan.prefix_cache, cheap, suffix)
    for link in the_plan.order:
        cheap = graph.reapply(link, cheap)
    fingerprint.salt = _after_salt(the_plan.after)
    full = the_plan.drop_remainder  # every global batch full: no per-sample facts needed (Note [Selecting by blocks])
    selected = _select(cheap, the_plan.global_batch, full, size, rank, fingerprint)
    for link in the_plan.maps:
        selected = graph.map_part(link, selected, None if full else 0)
    micro = batching.micro_batch_size(the_plan.global_batch, size, rank)
    if the_plan.batch.kind == graph.PADDED_BATCH:
        node = the_plan.batch.dataset
        shapes, values = node._padded_shapes, node._padding_values
        if not full:
            shapes, values = (shapes, tf.TensorShape([_FACTS])), (values, tf.constant(0, tf.int64))
        micro_batches = selected.padded_batch(micro, padded_shapes=shapes, padding_values=values,
                                              drop_remainder=full)
    else:
        micro_batches = selected.batch(micro, drop_remainder=full)
    result = micro_batches if full else micro_batches.map(_as_micro_batch)
    for link in the_plan.after:
        result = graph.reapply(link, result, suffix)
    result = result.scan(tf.constant(0, tf.int64), functools.partial(
        distributed_dataset.as_distributed_element, size=size, rank=rank,
        total=the_plan.global_batch if full else None))
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:  # Keras's progress bar and step count see the user's count
        result = result.apply(tf.data.experimental.assert_cardinality(cardinality))
    return result.with_options(dataset.options())


# Note [Selecting by blocks]
# The selection works on whole global batches of the cheap (pre-map) stream: batch by B, keep the
# rank's contiguous slice, unbatch. Per sample nothing is added when every global batch is full
# (drop_remainder): re-batching the rank's samples by b_r gives exactly its micro-batches, so the
# user's maps run on the user's own elements, as after `Dataset.shard`. Only a pipeline whose last
# global batch may be partial carries per sample a small vector of its batch's facts (_FACTS: the
# global size, and whether the sample is the placeholder of an empty micro-batch).
# The order check folds each global batch's hash here, in selection order; the links after the batch
# reorder whole batches by their constant seeds and counts, which the fingerprint's salt covers
# (Note [Same order on every rank] in order_check.py).
_FACTS = 2  # [global batch size, 1 if placeholder else 0]


def _select(cheap: tf.data.Dataset, global_batch: int, full: bool, size: int, rank: int,
            fingerprint: Fingerprint) -> tf.data.Dataset:
    """This rank's samples of each global batch of `cheap`, one by one (with their batch's facts unless
    every batch is `full`); folds each global batch into `fingerprint`."""
    def take_part(state, batch):
        position, folded = state
        state = (position + 1, fingerprint.fold(position, folded, batch_hash(batch)))
        if full:  # the slice is a constant
            start = batching.micro_batch_offset(global_batch, size, rank)
            end = start + batching.micro_batch_size(global_batch, size, rank)
            return state, tf.nest.map_structure(lambda tensor: tensor[start:end], batch)
        total, start, count = distributed_dataset.rank_range(batch, size, rank)
        placeholder = tf.equal(count, 0)
        begin = tf.where(placeholder, tf.constant(0, tf.int64), start)
        length = tf.where(placeholder, tf.constant(1, tf.int64), count)
        part = tf.nest.map_structure(lambda tensor: tensor[begin:begin + length], batch)
        facts = tf.stack([total, tf.cast(placeholder, tf.int64)])
        return state, (part, tf.tile(facts[tf.newaxis], [length, 1]))

    return cheap.batch(global_batch, drop_remainder=full).scan(
        (tf.constant(0, tf.int64), fingerprint.start()), take_part).unbatch()


def _after_salt(after: list[graph.Link]) -> int:
    """A number for the links after the batch with their constant arguments (seeds, counts): it differs
    between ranks exactly when those links reorder or pick batches differently."""
    described = []
    for link in after:
        if link.kind in (graph.PREFETCH, graph.CACHE):  # they never reorder: their arguments may differ
            continue
        node = link.dataset
        arguments = [graph.static_value(getattr(node, name, None)) for name in ("_seed", "_seed2", "_count",
                                                                                "_buffer_size")]
        described.append(f"{link.kind}{arguments}")
    return zlib.crc32("|".join(described).encode())


def _as_micro_batch(data, facts):
    """Cut the placeholder sample of an empty micro-batch away."""
    count = tf.where(tf.equal(facts[0, 1], 1), 0, tf.shape(facts)[0])
    return tf.nest.map_structure(lambda tensor: tensor[:count], data), facts[0, 0]
