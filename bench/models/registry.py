"""The models tnt-bench knows, by name, with what their inputs look like.

Image models take `image` float32[batch, size, size, channels] and predict one of
`num_classes` labels; translation models take `source`/`target_in` int32[batch,
sequence_length] and predict the next target token. Throughput is counted in the
model's `sample_unit`: images, or target tokens (sequence_length per sentence).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from bench.errors import BenchUsageError
from bench.models.transformer_sizes import BASE, BIG, SMALL, TINY

__all__ = ["ModelEntry", "MODELS", "get_model_entry"]


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    kind: str                       # "image" or "translation"
    build: Callable                 # () -> keras.Model
    default_micro_batch: int
    dataset: str                    # a name in bench.data.datasets.DATASETS
    image_size: int = 0
    channels: int = 3
    num_classes: int = 0
    vocab_size: int = 0
    sequence_length: int = 0

    @property
    def sample_unit(self) -> str:
        return "images" if self.kind == "image" else "tokens"

    @property
    def units_per_example(self) -> int:
        return 1 if self.kind == "image" else self.sequence_length


def _resnet(**kwargs):
    def build():
        from bench.models.resnet import resnet
        return resnet(**kwargs)
    return build


def _transformer(size, **kwargs):
    def build():
        from bench.models.transformer import transformer
        return transformer(size=size, **kwargs)
    return build


def _small_cnn():
    from bench.models.small_cnn import small_cnn
    return small_cnn()


MODELS: dict[str, ModelEntry] = {entry.name: entry for entry in (
    ModelEntry("resnet50", "ResNet-50 v1.5, ImageNet 224x224", "image",
               _resnet(image_size=224, num_classes=1000), 64, "imagenet2012",
               image_size=224, num_classes=1000),
    ModelEntry("resnet50_small", "ResNet-50 v1.5, small images (32x32 ImageNet)", "image",
               _resnet(image_size=32, num_classes=1000, small_images=True, name="resnet50_small"),
               64, "imagenet_resized/32x32", image_size=32, num_classes=1000),
    ModelEntry("resnet_tiny", "bottleneck ResNet, 1 block per stage, width 4, 16x16 (tests)", "image",
               _resnet(image_size=16, num_classes=10, blocks=(1, 1, 1, 1), base_width=4,
                       small_images=True, name="resnet_tiny"),
               8, "imagenet_resized/32x32", image_size=16, num_classes=10),
    ModelEntry("transformer", "Transformer base (Vaswani et al.), WMT14 en-de", "translation",
               _transformer(BASE, vocab_size=33708), 32, "wmt14_translate/de-en",
               vocab_size=33708, sequence_length=64),
    ModelEntry("transformer_big", "Transformer big (Vaswani et al.), WMT14 en-de", "translation",
               _transformer(BIG, vocab_size=33708), 16, "wmt14_translate/de-en",
               vocab_size=33708, sequence_length=64),
    ModelEntry("transformer_small", "Transformer 2+2 layers, d_model 256 (fits a laptop)", "translation",
               _transformer(SMALL, vocab_size=8192, name="transformer_small"), 32,
               "wmt14_translate/de-en", vocab_size=8192, sequence_length=32),
    ModelEntry("transformer_tiny", "Transformer 1+1 layers, d_model 32 (tests)", "translation",
               _transformer(TINY, vocab_size=128, max_length=64, name="transformer_tiny"), 8,
               "wmt14_translate/de-en", vocab_size=128, sequence_length=16),
    ModelEntry("small_cnn", "small CNN on 8x8 digits (mini benchmark)", "image",
               _small_cnn, 32, "digits", image_size=8, channels=1, num_classes=10),
)}


def get_model_entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise BenchUsageError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]
