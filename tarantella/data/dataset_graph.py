"""The transformations of a tf.data pipeline, read from its Python objects, and re-applied elsewhere.

A `tf.data.Dataset` built with `.map()`, `.batch()`, ... is a chain of Python
objects, each holding its input (`_input_dataset`) and the arguments it was
built with (`_map_func`, `_batch_size`, `_seed`...). `transformations` walks
that chain from the outermost dataset inwards and names each link; `reapply`
builds the same transformation on another input, with fresh state (a
re-applied shuffle starts its own seed generator, so its first iteration
gives the same order as the user's dataset's first iteration).

These are TensorFlow's private classes (tensorflow/python/data/ops/*_op.py);
they are only read here, never subclassed or patched, and an unknown link is
reported as kind OTHER (the caller then falls back to reading everything), so
a TensorFlow upgrade that renames one costs scaling, never correctness.
tf.distribute does the same job in C++ (the auto-shard and rebatch grappler
rewrites of the serialized graph); the Python chain is used here because it
keeps the user's traced functions and seeds as they are.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.util import structure
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import gen_dataset_ops

__all__ = ["Link", "MAP", "FILTER", "SHUFFLE", "REPEAT", "TAKE", "SKIP", "PREFETCH", "CACHE", "BATCH",
           "PADDED_BATCH", "OPTIONS", "OTHER", "ORDER_KINDS", "transformations", "reapply", "map_part",
           "static_value", "is_unseeded_shuffle"]

MAP, FILTER, SHUFFLE, REPEAT, TAKE, SKIP = "map", "filter", "shuffle", "repeat", "take", "skip"
PREFETCH, CACHE, BATCH, PADDED_BATCH, OPTIONS, OTHER = "prefetch", "cache", "batch", "padded_batch", "options", "other"

# Transformations that move, drop or repeat whole elements whatever their values: an element-wise
# map commutes with each of them, and each can be re-applied to a stream of batches of the same count.
ORDER_KINDS = (SHUFFLE, REPEAT, TAKE, SKIP, PREFETCH)

_KIND_OF_CLASS = {
    "_MapDataset": MAP, "_ParallelMapDataset": MAP, "_FilterDataset": FILTER, "_ShuffleDataset": SHUFFLE,
    "_RepeatDataset": REPEAT, "_TakeDataset": TAKE, "_SkipDataset": SKIP, "_PrefetchDataset": PREFETCH,
    "CacheDataset": CACHE, "_BatchDataset": BATCH, "_ParallelBatchDataset": BATCH,
    "_PaddedBatchDataset": PADDED_BATCH, "_OptionsDataset": OPTIONS,
}


@dataclasses.dataclass
class Link:
    kind: str                 # one of the kinds above
    dataset: tf.data.Dataset  # the Python object of this transformation (its input: dataset._input_dataset)

    @property
    def name(self) -> str:
        """As the user wrote it, e.g. "Dataset.map()" or "Dataset.unbatch()"."""
        if self.kind != OTHER:
            return f"Dataset.{self.kind}()"
        raw = type(self.dataset).__name__.strip("_").replace("Dataset", "")
        snake = "".join("_" + c.lower() if c.isupper() else c for c in raw).strip("_")
        return f"Dataset.{snake or type(self.dataset).__name__}()"


def transformations(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, list[Link]]:
    """(root, links): the links from the root (a source, or a dataset of several inputs) outwards."""
    links: list[Link] = []
    node = dataset
    while True:
        kind = _KIND_OF_CLASS.get(type(node).__name__, OTHER)
        input_dataset = getattr(node, "_input_dataset", None)
        if input_dataset is None or not isinstance(input_dataset, tf.data.Dataset):
            return node, links[::-1]
        links.append(Link(kind, node))
        node = input_dataset


def static_value(tensor):
    """The Python value of a constant tensor (a batch size, a seed), or None."""
    return tensor_util.constant_value(tensor) if isinstance(tensor, tf.Tensor) else tensor


def is_unseeded_shuffle(link: Link) -> bool:
    """A shuffle with neither an op seed nor a global seed: its order differs in every process."""
    if link.kind != SHUFFLE:
        return False
    seeds = (static_value(link.dataset._seed), static_value(link.dataset._seed2))
    return all(seed is None or int(seed) == 0 for seed in seeds)


def _wrap(variant, element_spec) -> tf.data.Dataset:
    return dataset_ops._VariantDataset(variant, element_spec)  # noqa: SLF001 (see the module docstring)


def reapply(link: Link, new_input: tf.data.Dataset, cache_suffix: str = "") -> tf.data.Dataset:
    """The link's transformation (an order kind, FILTER or CACHE) on `new_input`, with fresh state.
    A file cache gets `cache_suffix` appended to its file name (one file per rank)."""
    node = link.dataset
    if link.kind == SHUFFLE:
        variant = gen_dataset_ops.shuffle_dataset_v3(
            new_input._variant_tensor, buffer_size=node._buffer_size, seed=node._seed, seed2=node._seed2,
            seed_generator=gen_dataset_ops.dummy_seed_generator(),
            reshuffle_each_iteration=node._reshuffle_each_iteration, **new_input._common_args)
        return _wrap(variant, new_input.element_spec)
    if link.kind == REPEAT:
        return new_input.repeat(node._count)
    if link.kind == TAKE:
        return new_input.take(node._count)
    if link.kind == SKIP:
        return new_input.skip(node._count)
    if link.kind == PREFETCH:
        return new_input.prefetch(int(static_value(node._buffer_size)))
    if link.kind == CACHE:
        filename = static_value(node._filename)
        filename = filename.decode() if isinstance(filename, bytes) else (filename or "")
        return new_input.cache(filename + cache_suffix if filename else "")
    if link.kind == FILTER:
        predicate = node._predicate
        return new_input.filter(lambda *element: _call(predicate, _unsplat(element)))
    raise ValueError(f"tarantella: cannot re-apply {link.name}")


def map_part(link: Link, new_input: tf.data.Dataset, part: int | None = None) -> tf.data.Dataset:
    """The link's map applied to `new_input`'s elements (`part` given: to `element[part]` of its tuple
    elements, the other parts pass through), with the map's parallelism and determinism."""
    node = link.dataset
    function = node._map_func
    parallel = getattr(node, "_num_parallel_calls", None)
    deterministic = {"true": True, "false": False}.get(getattr(node, "_deterministic", "default"))

    def apply(*element):
        if part is None:
            return _call(function, _unsplat(element))
        return tuple(_call(function, piece) if index == part else piece for index, piece in enumerate(element))

    if parallel is None:
        return new_input.map(apply)
    return new_input.map(apply, num_parallel_calls=static_value(parallel), deterministic=deterministic)


def _unsplat(args):
    """tf.data calls a function with a tuple element's parts as separate arguments."""
    return args[0] if len(args) == 1 else args


def _call(wrapper, element):
    """Run a traced tf.data function (a StructuredFunctionWrapper) on one structured element."""
    flat = structure.to_tensor_list(wrapper._input_structure, element)
    return structure.from_tensor_list(wrapper.output_structure, wrapper.function(*flat))
