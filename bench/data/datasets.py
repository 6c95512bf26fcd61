"""The data sets the benchmarks refer to: where they come from and how big an epoch is.

`train_examples` is what an epoch's time is extrapolated to: the published size of
each TFDS training split (sentence pairs for translation).
"""
from __future__ import annotations

import dataclasses

from bench.errors import BenchUsageError

__all__ = ["DatasetInfo", "DATASETS", "get_dataset_info"]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    name: str                 # TFDS name, or "digits"
    train_examples: int
    eval_examples: int
    source: str               # "tfds" or "sklearn"
    eval_split: str = "validation"


DATASETS: dict[str, DatasetInfo] = {info.name: info for info in (
    DatasetInfo("imagenet2012", 1_281_167, 50_000, "tfds"),
    DatasetInfo("imagenet_resized/32x32", 1_281_167, 50_000, "tfds"),
    DatasetInfo("wmt14_translate/de-en", 4_508_785, 3_003, "tfds", eval_split="test"),
    DatasetInfo("digits", 1_437, 360, "sklearn", eval_split="test"),
)}


def get_dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise BenchUsageError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name]
