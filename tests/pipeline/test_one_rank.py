"""A pipelining script on one rank trains serially (Note [A pipelined model on one rank] in
tarantella/pipeline/entry.py): tnt-repro's serial reference and a laptop run need no ranks per stage."""
import keras
import numpy as np
import pytest

import tarantella as tnt
from tarantella.keras.layers import SplitLayer

pytestmark = pytest.mark.timeout(120)


def split_model():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((4,))
    hidden = SplitLayer()(keras.layers.Dense(6, activation="tanh")(inputs))
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


def test_pipelining_on_one_rank_trains_like_serial_keras():
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((32, 2)).astype(np.float32)
    serial = split_model()
    model = tnt.Model(split_model(), parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_micro_batches=4,
                      schedule="gpipe")
    assert isinstance(model, tnt.Model) and model.world_size == 1
    for m in (serial, model):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), serial.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_pipelining_arguments_are_checked_on_one_rank_too():
    with pytest.raises(TypeError, match="unexpected arguments \\['num_microbatches'\\]"):
        tnt.Model(split_model(), parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_microbatches=4)
    with pytest.raises(TypeError, match="pipelining's"):
        tnt.Model(split_model(), num_micro_batches=4)
