"""The benchmark models: sizes of the published ones, and the tiny ones train a step."""
import numpy as np
import pytest

from bench.data.synthetic import synthetic_batch
from bench.models.registry import MODELS, get_model_entry

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name, millions", [("resnet50", 25.6), ("transformer", 61.4),
                                            ("transformer_big", 210.9)])
def test_published_sizes(name, millions):
    # ResNet-50: 25.6M (He et al.); Transformer base/big with a 33,708-token shared vocabulary.
    assert get_model_entry(name).build().count_params() / 1e6 == pytest.approx(millions, abs=0.1)


@pytest.mark.parametrize("name", ["resnet_tiny", "transformer_tiny", "small_cnn"])
def test_tiny_models_predict_their_labels_shape(name):
    entry = MODELS[name]
    model = entry.build()
    inputs, labels = synthetic_batch(entry, 2)
    logits = np.asarray(model(inputs, training=False))
    classes = entry.num_classes or entry.vocab_size
    assert logits.shape == labels.shape + (classes,)


def test_resnet_v1_5_puts_the_stride_on_the_3x3():
    model = get_model_entry("resnet50").build()
    assert model.get_layer("stage2_block1_a_conv").strides == (1, 1)
    assert model.get_layer("stage2_block1_b_conv").strides == (2, 2)
