"""A plain Keras model whose optimizer is built before fit (tarantella/step/optimizers.py, as the test
launches' and tnt-repro's serial references have it) trains to the same bits, with the same optimizer
variables, as Keras building it inside its first traced step."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = pytest.importorskip("keras")

from tarantella.step import optimizers  # noqa: E402

CASES = {
    "adam": lambda: keras.optimizers.Adam(1e-2),
    "sgd with momentum, accumulating 2 steps": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True,
                                                                            gradient_accumulation_steps=2),
    "adamw with ema": lambda: keras.optimizers.AdamW(1e-2, use_ema=True, ema_overwrite_frequency=3),
    "loss scale (mixed_float16)": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.RMSprop(1e-2)),
}


def _trained(make_optimizer, policy, built_first):
    keras.backend.clear_session()
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.BatchNormalization(), keras.layers.Dropout(0.3),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=make_optimizer(), loss="mse", jit_compile=False)
        if built_first:
            optimizers.build_for_keras_train_step(model)
            assert model.optimizer.built
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(64, 6)).astype("float32"), rng.normal(size=(64, 3)).astype("float32")
        history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return (model.get_weights(), [v.numpy() for v in model.optimizer.variables],
                [v.path for v in model.optimizer.variables], history.history["loss"])
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("case", list(CASES))
def test_an_optimizer_built_before_fit_trains_as_keras_builds_it(case):
    policy = "mixed_float16" if "mixed" in case else "float32"
    weights, slots, paths, losses = _trained(CASES[case], policy, built_first=False)
    weights_first, slots_first, paths_first, losses_first = _trained(CASES[case], policy, built_first=True)
    assert paths_first == paths
    assert losses_first == losses
    for a, b in zip(weights + slots, weights_first + slots_first, strict=True):
        assert np.array_equal(a, b), case


def test_a_model_with_its_own_train_step_or_no_variables_yet_is_left_to_keras():
    class OwnStep(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    for model in (OwnStep([keras.Input((3,)), keras.layers.Dense(2)]), Subclassed()):
        model.compile(optimizer="adam", loss="mse")
        optimizers.build_for_keras_train_step(model)
        assert not model.optimizer.built, type(model).__name__
