"""The TFDS loading code on tfds.testing.mock_data (fake records, the real pipeline)."""
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from bench.data.tfds_source import tfds_dataset  # noqa: E402
from bench.errors import BenchUsageError  # noqa: E402
from bench.models.registry import get_model_entry  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", ["imagenet2012", "imagenet_resized/32x32"])
def test_images(name):
    entry = get_model_entry("resnet_tiny")
    with tfds.testing.mock_data(num_examples=6):
        images, labels = next(iter(tfds_dataset(name, entry, "train", training=True).batch(3)))
    assert tuple(images.shape) == (3, entry.image_size, entry.image_size, 3)
    assert images.dtype.name == "float32"
    assert ((labels.numpy() >= 0) & (labels.numpy() < entry.num_classes)).all()


def test_translation():
    entry = get_model_entry("transformer_tiny")
    with tfds.testing.mock_data(num_examples=4):
        inputs, labels, weights = next(iter(
            tfds_dataset("wmt14_translate/de-en", entry, "train", training=True).batch(2)))
    length = entry.sequence_length
    assert tuple(inputs["source"].shape) == (2, length) and tuple(labels.shape) == (2, length)
    target_in = inputs["target_in"].numpy()
    assert (target_in[:, 0] == 1).all()                                 # START
    assert (labels.numpy()[:, :-1] == target_in[:, 1:])[weights.numpy()[:, 1:] > 0].all()
    assert labels.numpy().max() < entry.vocab_size


def test_missing_data_set_is_a_clear_error(tmp_path):
    with pytest.raises(BenchUsageError, match="not prepared in"):
        tfds_dataset("imagenet2012", get_model_entry("resnet_tiny"), "train", training=True,
                     data_dir=str(tmp_path))
