"""Real data sets from TensorFlow Datasets, read from disk (never downloaded here).

`--data tfds:NAME` reads NAME from the TFDS data directory (TFDS_DATA_DIR or
~/tensorflow_datasets). ImageNet must be prepared by the user from its manually
downloaded archives (`tfds build imagenet2012 --manual_dir ...`); WMT14 with
`tfds build wmt14_translate/de-en`. The loading code is tested on
`tfds.testing.mock_data`, which fakes the records but runs the same pipeline.
"""
from __future__ import annotations

from bench.data import byte_tokens
from bench.errors import BenchUsageError
from bench.models.registry import ModelEntry

__all__ = ["load_examples", "image_pipeline", "translation_pipeline", "tfds_dataset"]

# ImageNet channel means and deviations (0-255 scale), as the MLPerf reference normalises.
_MEAN = (123.68, 116.78, 103.94)
_STD = (58.393, 57.12, 57.375)


def load_examples(name: str, split: str, data_dir: str | None = None, shuffle_files: bool = False):
    """The unbatched TFDS split as a dict dataset; a clear error if it is not on disk."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise BenchUsageError("--data tfds:... needs tensorflow-datasets: "
                              "pip install 'tarantella[bench]'") from None
    try:
        return tfds.load(name, split=split, data_dir=data_dir, download=False,
                         shuffle_files=shuffle_files)
    except Exception as error:  # DatasetNotFoundError, AssertionError (not prepared), ...
        raise BenchUsageError(
            f"TFDS data set {name!r} (split {split!r}) is not prepared in "
            f"{data_dir or 'the TFDS data directory (TFDS_DATA_DIR or ~/tensorflow_datasets)'}: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}; prepare it "
            f"with `tfds build {name}` or use --data synthetic") from None


def image_pipeline(examples, entry: ModelEntry, training: bool):
    """(image float32 normalised, label int32) pairs at the model's image size."""
    import tensorflow as tf
    mean = tf.constant(_MEAN, tf.float32)
    std = tf.constant(_STD, tf.float32)
    size = entry.image_size

    def prepare(example):
        image = tf.cast(example["image"], tf.float32)
        if entry.channels == 1 and image.shape[-1] != 1:
            image = tf.image.rgb_to_grayscale(image)
        image = tf.image.resize(image, (size, size))
        if training:
            image = tf.image.random_flip_left_right(image)
        if entry.channels == 3:
            image = (image - mean) / std
        label = tf.cast(example["label"], tf.int32) % entry.num_classes
        return image, label

    return examples.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def translation_pipeline(examples, entry: ModelEntry, source_language: str = "en",
                         target_language: str = "de"):
    """(inputs {source, target_in}, labels, weights) with byte tokens, length sequence_length."""
    import tensorflow as tf
    length = entry.sequence_length
    span = entry.vocab_size - 3

    def tokens(text):
        data = tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32)
        return data % span + 3

    def fit(ids, size):
        ids = ids[:size]
        return tf.pad(ids, [[0, size - tf.shape(ids)[0]]])

    def prepare(example):
        source = fit(tokens(example[source_language]), length)
        target = tokens(example[target_language])[:length - 1]
        target_in = fit(tf.concat([[byte_tokens.START], target], 0), length)
        labels = fit(tf.concat([target, [byte_tokens.END]], 0), length)
        weights = tf.cast(tf.not_equal(labels, byte_tokens.PAD), tf.float32)
        return {"source": source, "target_in": target_in}, labels, weights

    return examples.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def tfds_dataset(name: str, entry: ModelEntry, split: str, training: bool, data_dir: str | None = None):
    """The model's unbatched examples from TFDS data set `name`."""
    examples = load_examples(name, split, data_dir, shuffle_files=training)
    if entry.kind == "image":
        return image_pipeline(examples, entry, training)
    return translation_pipeline(examples, entry)
