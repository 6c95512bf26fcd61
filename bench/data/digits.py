"""sklearn's digits (8x8 grey images of 0-9), shipped with scikit-learn: the mini benchmark's data."""
from __future__ import annotations

import numpy as np

__all__ = ["load_digits_split"]


def load_digits_split(seed: int = 0, test_fraction: float = 0.2):
    """((x_train, y_train), (x_test, y_test)); images float32 in [0, 1], shape [n, 8, 8, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels)
    return (x_train, y_train), (x_test, y_test)
