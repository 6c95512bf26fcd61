"""The input pipeline of MLPerf's ResNet-50 reference, for `tnt-bench scaling --data jpeg`.

    files of JPEG Example protos  ->  this rank's files only (file i to rank i % N)  ->  shuffled files
    ->  interleave(TFRecordDataset, 10 files at once, parallel)  ->  shuffle(10,000)  ->  repeat
    ->  map(parse, decode and random crop, resize, flip, normalise; AUTOTUNE)  ->  batch  ->  prefetch(AUTOTUNE)

as mlcommons/training image_classification/tensorflow2/imagenet_preprocessing.py reads ImageNet (files
"train-00000-of-01024" ..., each worker its shard of the files, `tf.image.sample_distorted_bounding_box` with
area 5-100 % and aspect ratio 3/4-4/3, the fused decode-and-crop, a bilinear resize to the model's size, a
random left-right flip; then the channel means subtracted, here also divided by the deviations, as
bench/data/tfds_source.py normalises). Each rank decodes only its own images: the work per rank is the
micro-batch's, whatever the number of ranks.

Note [Sharding after the decode]
The original Tarantella's published ResNet-50 runs read ImageNet otherwise. Their script
(cc-hpc-itwm/tarantella_models src/models/resnet at d77dbb2, 2020-12-02, the day before the figures'
commit) batches a pipeline that decodes every image (the TensorFlow model garden's imagenet_preprocessing:
interleave, map(parse_record), batch(global batch), prefetch) and hands it to tnt.Model.fit, which
distributes it (src/tarantella/datasets/distributed_dataset.py at 3c43973): the user's transformations are
applied again on every rank, the batches are cut into micro-batches, and only then sharded,
dataset.shard(num_ranks, rank). tf.data computes what a shard skips, so every rank reads and decodes the
whole global batch, N micro-batches, to keep one: the input work per rank grows with N. decoded_ranks=K
builds that pipeline as rank `rank % K` of K ranks runs it (all files, shard after batch), so one process
can measure what one of K ranks decodes; 0 is the reference's own sharding by files.
"""
from __future__ import annotations

import glob
import os

from bench.errors import BenchUsageError

__all__ = ["FILE_PATTERN", "is_jpeg", "given_directory", "train_files", "files_of_rank", "rank_dataset",
           "parse_and_preprocess"]

FILE_PATTERN = "train-*"
_CYCLE_LENGTH = 10          # files read at once (the reference's interleave)
_SHUFFLE_BUFFER = 10_000    # the reference's _SHUFFLE_BUFFER
_MEAN = (123.68, 116.78, 103.94)
_STD = (58.393, 57.12, 57.375)


def is_jpeg(data: str) -> bool:
    """Whether a --data value asks for this pipeline: `jpeg` (the generated set) or `jpeg:DIR`."""
    return data == "jpeg" or data.startswith("jpeg:")


def given_directory(data: str) -> str | None:
    """DIR of `jpeg:DIR`; None for `jpeg` (the generated set)."""
    return data.split(":", 1)[1] if data.startswith("jpeg:") else None


def train_files(directory: str) -> list[str]:
    files = sorted(path for path in glob.glob(os.path.join(directory, FILE_PATTERN)) if not path.endswith(".tmp"))
    if not files:
        raise BenchUsageError(f"--data jpeg:{directory}: no TFRecord files {FILE_PATTERN} there (the layout of "
                              f"MLPerf's ResNet-50 reference); use --data jpeg for a generated set")
    return files


def files_of_rank(files: list[str], rank: int, ranks: int) -> list[str]:
    """This rank's files: file i goes to rank i % ranks (the reference's Dataset.shard on the file names)."""
    if len(files) < ranks:
        raise BenchUsageError(f"--data jpeg: {len(files)} files for {ranks} ranks: every rank reads files of its "
                              f"own, so a set needs at least one file per rank")
    return files[rank::ranks]


def parse_and_preprocess(record, image_size: int, channels: int = 3):
    """(normalised float32 image of image_size x image_size, int32 label in 0..999) of one Example."""
    import tensorflow as tf
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    jpeg = features["image/encoded"]
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg), bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.1,
        aspect_ratio_range=[0.75, 1.33], area_range=[0.05, 1.0], max_attempts=100,
        use_image_if_no_bounding_boxes=True)
    offset_y, offset_x, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    image = tf.image.decode_and_crop_jpeg(jpeg, tf.stack([offset_y, offset_x, height, width]), channels=3)
    image = tf.image.random_flip_left_right(image)
    image = tf.image.resize(image, (image_size, image_size), method="bilinear")
    if channels == 1:
        image = tf.image.rgb_to_grayscale(image)
    else:
        image = (image - tf.constant(_MEAN)) / tf.constant(_STD)
    return image, tf.cast(features["image/class/label"], tf.int32)


def rank_dataset(files: list[str], rank: int, ranks: int, micro_batch: int, image_size: int, channels: int = 3,
                 num_classes: int = 1000, seed: int | None = None, decoded_ranks: int = 0):
    """This rank's endless stream of micro-batches (images, labels) from its own files, or with decoded_ranks=K
    from every file, decoding K micro-batches for each one kept (Note [Sharding after the decode])."""
    import tensorflow as tf
    mine = files if decoded_ranks else files_of_rank(files, rank, ranks)

    def example(record):
        image, label = parse_and_preprocess(record, image_size, channels)
        return image, label % num_classes

    return (tf.data.Dataset.from_tensor_slices(mine).shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
            .interleave(tf.data.TFRecordDataset, cycle_length=min(_CYCLE_LENGTH, len(mine)),
                        num_parallel_calls=tf.data.AUTOTUNE)
            .shuffle(_SHUFFLE_BUFFER, seed=seed).repeat()
            .map(example, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(micro_batch, drop_remainder=True)
            .shard(max(decoded_ranks, 1), rank % max(decoded_ranks, 1)).prefetch(tf.data.AUTOTUNE))
