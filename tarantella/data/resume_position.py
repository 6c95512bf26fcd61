"""A rank's training data, resumed where a commit left it (Note [Resuming the data where it stood]).

Note [Resuming the data where it stood]
A seeded shuffle with reshuffle_each_iteration draws its order from a generator that moves on at every new
iterator of the dataset. Keras makes one iterator per epoch, and with a dataset of known length one more at
the end of each epoch, which it never reads (keras/src/trainers/epoch_iterator.py): so serial Keras's epoch e
reads the dataset's iterator number 2e, not e. Rather than follow that rule, a fit of an elastic job counts
the iterators Keras makes of its dataset (`IterationCount`), and a commit records the count. A new process
that resumes from it first makes (and drops) as many iterators as the interrupted run had made before the one
it was reading, which draws their seeds without reading an element; the next iterator Keras makes then
yields the interrupted epoch's order.

With fit(steps_per_epoch=...), Keras reads one iterator through the whole fit (a dataset that repeats
forever): the new process makes as many iterators as were made before that one, and reads its dataset from
the batch the resumed epoch started at (a skip over the earlier epochs' batches of this fit, which reads them).

The batches the commit had done in that epoch are read and dropped by the train function
(tarantella/elastic/fit_commits.py) instead of being cut off the dataset: the dataset keeps its length, so
Keras counts the epoch's steps (and makes its iterators) as in the uninterrupted run, and the dropped batches
cost only their input pipeline's work.
"""
from __future__ import annotations

import tensorflow as tf

__all__ = ["IterationCount", "advance"]


class IterationCount:
    """Counts the iterators made of `dataset` from now on (its class is swapped for a subclass that counts;
    the object, its graph and its generators stay the same)."""

    def __init__(self, dataset: tf.data.Dataset):
        self.value = 0
        base, count = type(dataset), self

        def counted_iter(self_):
            count.value += 1
            return base.__iter__(self_)

        dataset.__class__ = type(f"Counted{base.__name__}", (base,), {"__iter__": counted_iter})


def advance(dataset: tf.data.Dataset, iterations: int) -> None:
    """Makes and drops `iterations` iterators of `dataset` (Note [Resuming the data where it stood])."""
    for _ in range(iterations):
        iter(dataset)
