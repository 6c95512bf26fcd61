"""Every weight element is compared (Note [Every element compared]): one process, the real recorder.

A model above 250k values (where the checker once compared only norms) trains twice from the
same seed; the second run gets a perturbation orthogonal to a kernel, which moves the kernel's
norm by less than the tolerance but every touched element by its own size.
"""
import numpy as np
import pytest

from repro import compare, records, tolerance, verdicts
from tarantella._repro import hook, weights

pytestmark = pytest.mark.timeout(120)

WIDTH = 520   # Dense(520 -> 520): 270,920 values, two hash chunks of the kernel


def _train(directory, *, reference=None, perturb=None):
    import keras

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).standard_normal((48, WIDTH)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(WIDTH, name="wide"),
                              keras.layers.Dense(2, name="head")], name="model")  # same keys in both runs
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [perturb] if perturb is not None else []
    recorder = hook.make_recorder(str(directory), reference=reference, store_weights=True)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=callbacks + [recorder], verbose=0)
    return model


def _orthogonal_perturbation():
    import keras

    class Perturb(keras.callbacks.Callback):
        """After step 1: kernel += d, d orthogonal to the kernel, on the last 1000 elements only."""
        norm_change = None

        def on_train_batch_end(self, batch, logs=None):
            if batch != 0:
                return
            kernel = self.model.layers[0].kernel
            w = np.asarray(kernel.numpy(), dtype=np.float64).reshape(-1)
            part = w[-1000:]
            r = np.random.default_rng(5).standard_normal(1000)
            d = r - (r @ part) / (part @ part) * part
            d *= 1e-3 * np.abs(w).max() / np.abs(d).max()
            changed = w.copy()
            changed[-1000:] += d
            kernel.assign(changed.reshape(kernel.shape).astype(np.float32))
            Perturb.norm_change = abs(np.linalg.norm(changed.astype(np.float32).astype(np.float64))
                                      - np.linalg.norm(w)) / np.linalg.norm(w)

    return Perturb()


def test_orthogonal_perturbation_of_a_large_model_is_caught(tmp_path, monkeypatch):
    for name in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", hook.MAX_STEPS_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    _train(tmp_path / "serial")
    perturb = _orthogonal_perturbation()
    _train(tmp_path / "other", reference=str(tmp_path / "serial"), perturb=perturb)
    serial = records.load_record(str(tmp_path / "serial"), "serial")
    other = records.load_record(str(tmp_path / "other"), "2 devices")
    assert serial.elements() > 250_000 and other.compared_with(serial)

    floor = tolerance.derive(compare.differences(serial, serial))   # no calibration difference: the floor
    # A norm-only comparison would pass: the kernel's norm moved by less than the tolerance.
    assert perturb.norm_change < floor.at(1)
    verdict = verdicts.equivalence(serial, other, 2, floor, exact=False)
    assert verdict["verdict"] == "DIVERGENT", verdict
    where = verdict["first_divergence"]
    assert where["step"] == 1 and where["variable"].endswith("kernel") and where["difference"] > 1e-4
    assert verdict["compared"]["elements_per_step"] == serial.elements()
    assert verdict["compared"]["steps"] == 4 and verdict["compared"]["tensors"] == 4
    # Chunk hashes locate it: the kernel's first chunk is untouched at step 1, its second is not.
    reference_kernel = serial.weight(1, serial.keys()[0])
    kernel = other.weight(1, serial.keys()[0])
    assert len(kernel["chunks"]) == 2
    assert kernel["chunks"][0] == reference_kernel["chunks"][0] and kernel["chunks"][1] != reference_kernel["chunks"][1]
    assert kernel["max_abs"] > 0 and kernel["max_rel"] == pytest.approx(kernel["max_abs"] / kernel["scale"])


def test_chunked_difference_equals_the_whole_array_difference(monkeypatch):
    monkeypatch.setattr(weights, "CHUNK_ELEMENTS", 7)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 9)).astype(np.float32)
    b = a + rng.standard_normal((5, 9)).astype(np.float32) * 1e-3
    found = weights.difference(b, a)
    expected = np.abs(b.astype(np.float64) - a).max()
    assert found["max_abs"] == pytest.approx(expected) and found["scale"] == pytest.approx(np.abs(a).max())
    assert len(weights.chunk_hashes(a)) == 7                      # ceil(45 / 7)
    assert weights.difference(a, a) == {"max_abs": 0.0, "max_rel": 0.0, "scale": pytest.approx(np.abs(a).max())}
    nan = a.copy()
    nan[0, 0] = np.nan
    assert weights.difference(nan, a)["max_abs"] == np.inf        # NaN never passes as "no difference"
    assert weights.difference(a[:4], a)["max_rel"] == np.inf      # nor does another shape
