"""Synthetic data of the examples' shapes: the same arrays in the serial and the wrapped run."""
import numpy as np

SAMPLES, BATCH = 20, 8   # 20 samples in global batches of 8: a partial last batch of 4


def images(shape, n=SAMPLES, seed=0):
    return np.random.default_rng(seed).uniform(size=(n,) + tuple(shape)).astype("float32")


def classes(count, n=SAMPLES, seed=1):
    return np.random.default_rng(seed).integers(0, count, size=(n,)).astype("int32")


def tokens(vocabulary, length, n=SAMPLES, seed=2):
    return np.random.default_rng(seed).integers(1, vocabulary, size=(n, length)).astype("int32")


def normal(shape, n=SAMPLES, seed=3):
    return np.random.default_rng(seed).normal(size=(n,) + tuple(shape)).astype("float32")
