"""A JPEG training set made here, in the shape of ImageNet's (ILSVRC 2012 train), for `--data jpeg`.

ImageNet cannot be downloaded here, and its decoding cost is what a real-data run adds to a step. So the set
is generated, as TFRecord files of JPEG-encoded Example protos laid out as the MLPerf reference reads them
(`image/encoded`, `image/class/label`, `image/height`, `image/width`), with the distribution below. What
decoding costs depends on a JPEG's pixels and its bytes; both follow ImageNet's:

Note [The distribution of the generated JPEG set]
  size         the long side is 500 px for 80 % of the images (ImageNet's photos came from Flickr and
               search engines at their "medium" size, 500 px on the long side; assumed share), uniform in
               250..800 px otherwise; aspect ratio 4:3 (65 %), 3:2 (20 %), 1:1 (10 %), 16:9 (5 %),
               landscape 75 % (assumed shares). Mean about 190 k pixels, ImageNet's median image being
               500 x 375 (187.5 k).
  content      each channel a random field whose amplitude spectrum falls as 1/f, the power spectrum of
               natural images (Field 1987, JOSA A 4(12); van der Schaaf & van Hateren 1996, Vision Research
               36(17): power ~ 1/f^(2 +- 0.26)), luminance-dominated with weaker chroma, so that JPEG
               spends its bits where it does on photographs.
  quality      JPEG quality uniform in 85..95 (assumed; ImageNet's files carry their sources' settings).
  check        not fitted: the resulting mean file size is compared with ImageNet's, 138 GiB for
               1,281,167 training images (ILSVRC2012_img_train.tar) = 113 KiB per image; `describe()` gives
               the set's own mean (a 64-image set here: see results/input_cost/README.md).
  labels       uniform over 1000 classes (a benchmark needs no learnable signal).
The set is a function of (images, seed): made once into a cache directory and reused.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

__all__ = ["IMAGENET_MEAN_BYTES", "DEFAULT_IMAGES", "DEFAULT_FILES", "generate", "ensure_set", "describe",
           "default_cache_dir", "image_size_of"]

IMAGENET_MEAN_BYTES = 147_897_477_120 / 1_281_167   # ILSVRC2012_img_train.tar (138 GiB) / training images
DEFAULT_IMAGES = 1024
DEFAULT_FILES = 32        # enough files for 32 ranks to read their own (MLPerf's reference: 1024 for 1.28 M)
_LONG_SIDE_MEDIUM, _MEDIUM_SHARE = 500, 0.8
_OTHER_LONG_SIDE = (250, 800)
_ASPECTS = ((4 / 3, 0.65), (3 / 2, 0.20), (1.0, 0.10), (16 / 9, 0.05))
_LANDSCAPE_SHARE = 0.75
_QUALITY = (85, 95)
_SPECTRUM_EXPONENT = 1.0  # amplitude ~ 1/f^a (power ~ 1/f^2a)
_CLASSES = 1000
_FORMAT = 1               # bump when the generator changes: a cached set of another format is made again


def image_size_of(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width) of one image (Note [The distribution of the generated JPEG set])."""
    long_side = _LONG_SIDE_MEDIUM if rng.random() < _MEDIUM_SHARE else int(rng.integers(*_OTHER_LONG_SIDE))
    ratios, shares = zip(*_ASPECTS)
    ratio = ratios[int(rng.choice(len(ratios), p=shares))]
    short_side = max(1, int(round(long_side / ratio)))
    return (short_side, long_side) if rng.random() < _LANDSCAPE_SHARE else (long_side, short_side)


def _field(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    frequency = np.sqrt(fx * fx + fy * fy)
    frequency[0, 0] = 1.0
    amplitude = frequency ** -_SPECTRUM_EXPONENT
    amplitude[0, 0] = 0.0
    spectrum = (rng.standard_normal(amplitude.shape) + 1j * rng.standard_normal(amplitude.shape)) * amplitude
    field = np.fft.irfft2(spectrum, s=(height, width))
    return field / max(float(field.std()), 1e-12)


def _pixels(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    luminance, chroma_a, chroma_b = (_field(height, width, rng) for _ in range(3))
    rgb = np.stack([luminance + 0.3 * chroma_a, luminance - 0.2 * chroma_a + 0.2 * chroma_b,
                    luminance - 0.3 * chroma_b], axis=-1)
    return np.clip(128.0 + 45.0 * rgb, 0, 255).astype(np.uint8)


def _example(jpeg: bytes, label: int, height: int, width: int):
    import tensorflow as tf

    def ints(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
        "image/class/label": ints(label), "image/height": ints(height), "image/width": ints(width),
    })).SerializeToString()


def generate(directory: str, images: int = DEFAULT_IMAGES, files: int = DEFAULT_FILES, seed: int = 0) -> dict:
    """Write `images` JPEG examples into `files` TFRecord files in `directory`; returns the set's description
    (also written as set.json). Image i goes into file i % files, so every file holds images // files or one more."""
    import tensorflow as tf
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"train-{index:05d}-of-{files:05d}" for index in range(files)]
    writers = [tf.io.TFRecordWriter(os.path.join(directory, name + ".tmp")) for name in names]
    sizes, pixels, qualities = [], [], []
    try:
        for index in range(images):
            height, width = image_size_of(rng)
            quality = int(rng.integers(_QUALITY[0], _QUALITY[1] + 1))
            jpeg = tf.io.encode_jpeg(_pixels(height, width, rng), quality=quality).numpy()
            writers[index % files].write(_example(jpeg, int(rng.integers(_CLASSES)), height, width))
            sizes.append(len(jpeg))
            pixels.append(height * width)
            qualities.append(quality)
    finally:
        for writer in writers:
            writer.close()
    for name in names:
        os.replace(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
    description = {"format": _FORMAT, "images": images, "files": names, "seed": seed,
                   "mean_bytes": float(np.mean(sizes)), "mean_pixels": float(np.mean(pixels)),
                   "median_pixels": float(np.median(pixels)), "mean_quality": float(np.mean(qualities)),
                   "imagenet_mean_bytes": IMAGENET_MEAN_BYTES,
                   "distribution": "Note [The distribution of the generated JPEG set] in bench/data/imagenet_like.py"}
    with open(os.path.join(directory, "set.json"), "w") as handle:
        json.dump(description, handle, indent=2)
    return description


def describe(directory: str) -> dict | None:
    """The description of the set in `directory`, or None when there is no complete set of this format."""
    try:
        with open(os.path.join(directory, "set.json")) as handle:
            description = json.load(handle)
    except (OSError, ValueError):
        return None
    if description.get("format") != _FORMAT:
        return None
    if not all(os.path.exists(os.path.join(directory, name)) for name in description["files"]):
        return None
    return description


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tarantella", "imagenet_like")


def ensure_set(directory: str | None = None, images: int = DEFAULT_IMAGES, files: int = DEFAULT_FILES,
               seed: int = 0) -> tuple[str, dict]:
    """(directory, description) of the set of these parameters, made first if it is not there. Without
    `directory`, a directory of the cache named after the parameters."""
    if directory is None:
        key = hashlib.sha256(json.dumps([_FORMAT, images, files, seed]).encode()).hexdigest()[:12]
        directory = os.path.join(default_cache_dir(), f"{images}x{files}-{key}")
    description = describe(directory)
    if description is None:
        description = generate(directory, images, files, seed)
    return directory, description
