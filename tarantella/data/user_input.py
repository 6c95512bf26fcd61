"""What `fit`/`evaluate`/`predict` accept, turned into this rank's micro-batch stream.

    distribute(x, y, sample_weight, batch_size=..., size=N, rank=r) -> tf.data.Dataset

is THE function that turns any user input into this rank's stream of
micro-batches (elements as in tarantella/data/distributed_dataset.py); the
model's fit/evaluate/predict and `tnt.distribute_dataset` use it. Accepted, as
in Keras:
- a batched tf.data.Dataset (each element a global batch): rewritten so that
  each rank runs the per-sample work for its own samples only (Note [Rewriting
  the user's pipeline] in rank_pipeline.py), or, where that would change a
  batch, read in full and sliced, with one warning line on the master;
- an unbatched tf.data.Dataset with `micro_batch_size` (global batch = that
  times the rank count): the same, as `dataset.batch(micro_batch_size * N)`;
- numpy arrays, lists/tuples/dicts of arrays, with `batch_size` (the global
  batch size, default 32 as in Keras): each step gathers only the rank's rows;
- a keras.utils.PyDataset (each rank reads about 1/N of its batches, Note
  [Reading a PyDataset per rank] in python_input.py) or a Python generator of
  batches (read in full on every rank, with one note on the master);
- a stream already distributed (`distribute_datasets_from_function`, or a
  second call on distribute's own output): passed through.
The order of the pipeline's samples must be the same on every rank: unseeded
shuffles are refused, and `order_check.callbacks(...)` compares a fingerprint of
every global batch after the first step and each epoch (Note [Same order on every rank]).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tarantella.data import batching, distributed_dataset, order_check, python_input, rank_pipeline

__all__ = ["distribute", "split_for_validation", "validation_parts", "unpack_validation_data", "as_arrays"]

DEFAULT_BATCH_SIZE = 32


def _is_arrays(value) -> bool:
    leaves = tf.nest.flatten(value)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) or hasattr(leaf, "__array__")
                                for leaf in leaves)


def as_arrays(value):
    """`value`'s leaves as numpy arrays, its lists as tuples (as Keras's array adapter: tf.data would stack a
    list of arrays into one tensor, where Keras hands the model a structure)."""
    return keras.tree.lists_to_tuples(keras.tree.map_structure(np.asarray, value))


def distribute(x, y=None, sample_weight=None, *, batch_size=None, micro_batch_size=None, shuffle=False,
               seed=0, keras_order=False, class_weight=None, size: int, rank: int, what: str = "batch_size",
               for_predict: bool = False) -> tf.data.Dataset:
    """This rank's micro-batches of the user's data (see tarantella.data.distributed_dataset). `for_predict`:
    the input of predict (a PyDataset's epoch callbacks then run as Keras's predict runs them)."""
    if isinstance(x, tf.data.Dataset) and distributed_dataset.is_distributed_element(x.element_spec):
        return x
    python_kind = ("keras.utils.PyDataset" if python_input.is_py_dataset(x)
                   else "Python generator" if python_input.is_generator(x) else None)
    if isinstance(x, tf.data.Dataset) or python_kind:
        if y is not None or sample_weight is not None:
            raise ValueError(f"tarantella: with a {python_kind or 'tf.data.Dataset'}, pass targets and sample "
                             f"weights inside it, not as `y`/`sample_weight` (as in Keras)")
        if class_weight:
            raise ValueError("tarantella: class_weight is supported for array inputs only; fold the weights "
                             "into the dataset as sample weights")
        if micro_batch_size is not None and python_kind:
            raise ValueError(f"tarantella: a {python_kind} yields global batches: tnt_micro_batch_size applies to "
                             f"unbatched tf.data.Datasets only")
        if batch_size is not None and micro_batch_size is None:
            raise ValueError(f"tarantella: `{what}` cannot be used with a {python_kind or 'tf.data.Dataset'} (as in "
                             f"Keras): batch the input with the global batch size"
                             + ("" if python_kind else ", or pass it unbatched with tnt_micro_batch_size"))
        if python_input.is_py_dataset(x):
            if size > 1:  # each rank reads about 1/N of the batches (Note [Reading a PyDataset per rank])
                return python_input.py_dataset_for_rank(x, shuffle, seed, size, rank, keras_reset=not for_predict)
            return _sliced(python_input.from_py_dataset(x, shuffle, seed, keras_reset=not for_predict), size, rank)
        if python_kind:
            rank_pipeline.warn_on_master(rank, python_input.GENERATOR_NOTE)
            return _sliced(python_input.from_generator(x), size, rank)
        if micro_batch_size is not None:
            if micro_batch_size < 1:
                raise ValueError(f"tarantella: tnt_micro_batch_size must be at least 1, got {micro_batch_size}")
            x = x.batch(micro_batch_size * size)
        return from_batched_dataset(x, size, rank)
    if x is None or not _is_arrays(x):
        raise TypeError(f"tarantella: unsupported input of type {type(x).__name__}: pass numpy arrays (or "
                        f"lists/dicts of them), a tf.data.Dataset, a keras.utils.PyDataset or a generator")
    if micro_batch_size is not None:
        if batch_size is not None:
            raise ValueError(f"tarantella: pass either `{what}` (global) or the micro-batch size, not both")
        batch_size = micro_batch_size * size
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    batching.check_global_batch_size(batch_size, size, what)
    if class_weight:
        if y is None:
            raise ValueError("tarantella: class_weight needs targets `y`")
        weights = distributed_dataset.class_weights_as_sample_weights(y, class_weight)
        sample_weight = weights if sample_weight is None else np.asarray(sample_weight) * weights
    if sample_weight is not None and y is None:
        raise ValueError("tarantella: `sample_weight` was given without targets `y` (Keras would drop it without a "
                         "word); pass `y`, or fold the weights into your own train_step's input")
    # Packed as Keras packs arrays: a model's own train_step receives the same structure as in serial Keras
    # (a bare `x` when there are no targets, not a 1-tuple).
    batch = keras.utils.pack_x_y_sample_weight(*(None if part is None else as_arrays(part)
                                                 for part in (x, y, sample_weight)))
    return distributed_dataset.from_arrays(batch, batch_size, shuffle, seed, size, rank, keras_order)


def from_batched_dataset(dataset: tf.data.Dataset, size: int, rank: int) -> tf.data.Dataset:
    """This rank's micro-batches of a pipeline of global batches: rewritten if possible, else sliced."""
    if size == 1:  # every sample is this rank's: the rewrite would only add its per-sample bookkeeping
        return _sliced(dataset, size, rank)
    unseeded = rank_pipeline.unseeded_shuffles(dataset)
    if unseeded:
        raise ValueError(f"tarantella: the input pipeline has an unseeded {unseeded[0]}: every rank would shuffle "
                         f"differently and samples would be lost and repeated; give it a seed, the same on all "
                         f"ranks (`dataset.shuffle(n, seed=42)`), or set tf.random.set_seed(...) before "
                         f"building the pipeline")
    the_plan = rank_pipeline.plan(dataset)
    if isinstance(the_plan, str):
        rank_pipeline.warn_on_master(rank, f"tarantella: every rank reads every global batch in full: {the_plan}")
        return _sliced(dataset, size, rank)
    for note in the_plan.notes:
        rank_pipeline.warn_on_master(rank, note)
    if not the_plan.maps:  # no per-sample work after the barrier: selecting early saves nothing
        return _sliced(dataset, size, rank)
    fingerprint = order_check.Fingerprint()
    return order_check.attach(rank_pipeline.for_rank(dataset, the_plan, size, rank, fingerprint), fingerprint)


def _sliced(dataset: tf.data.Dataset, size: int, rank: int) -> tf.data.Dataset:
    fingerprint = order_check.Fingerprint()
    return order_check.attach(distributed_dataset.sliced_for_rank(dataset, size, rank, fingerprint), fingerprint)


def split_for_validation(x, y, sample_weight, validation_split: float):
    """Keras's `validation_split` on arrays: the last fraction (before shuffling) validates."""
    if not _is_arrays(x):
        raise ValueError("tarantella: validation_split is only supported for array inputs (as in Keras); "
                         "pass validation_data instead")
    x, y, sample_weight = (None if part is None else as_arrays(part) for part in (x, y, sample_weight))
    at = batching.validation_split_at(len(tf.nest.flatten(x)[0]), validation_split)

    def cut(part, train):
        if part is None:
            return None
        return tf.nest.map_structure(lambda array: array[:at] if train else array[at:], part)

    return (cut(x, True), cut(y, True), cut(sample_weight, True)), (cut(x, False), cut(y, False),
                                                                     cut(sample_weight, False))


def validation_parts(validation_data, validation_batch_size, batch_size, micro_batch_size, validation_micro_batch_size,
                     size: int):
    """fit's validation_data as (x, y, sample_weight, global batch size): a Dataset keeps its own batches; arrays
    take validation_batch_size, else fit's batch_size, else (with micro-batch sizes) micro-batches x ranks."""
    x, y, sample_weight = unpack_validation_data(validation_data)
    if isinstance(x, tf.data.Dataset):
        return x, y, sample_weight, None
    validation_batch_size = validation_batch_size or (None if validation_micro_batch_size else batch_size)
    if validation_batch_size is None and validation_micro_batch_size is None:
        validation_batch_size = micro_batch_size * size if micro_batch_size else None
    return x, y, sample_weight, validation_batch_size


def unpack_validation_data(validation_data) -> tuple:
    """fit's validation_data as (x, y, sample_weight), as Keras reads it: a tuple or list is (x, y[, sample_weight]),
    anything else (a Dataset, a PyDataset) is x alone."""
    if isinstance(validation_data, (tuple, list)):
        return keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
    return validation_data, None, None
