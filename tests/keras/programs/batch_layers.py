"""Each rank: models with layers that look at the batch (random layers, BatchNormalization) trained under
tnt.Model equal serial Keras trained in this process on the same data (issue 19 §7): weights, moving statistics
and seed states. 26 samples in global batches of 8: a partial last batch of 2 (at 3 ranks one rank runs an
empty micro-batch). Prints "RESULT <case> <max relative difference> <ranks' weights identical>"."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from serial_comparison import elementwise_difference, identical_on_ranks  # noqa: E402

SAMPLES, BATCH, EPOCHS = 26, 8, 2
L = keras.layers


class UserNoise(L.Layer):
    """A user's own layer drawing with keras.random."""
    def __init__(self):
        super().__init__()
        self.seeds = keras.random.SeedGenerator(5)

    def call(self, x, training=False):
        return x + 0.1 * keras.random.normal(tf.shape(x), seed=self.seeds) if training else x


def dense_family():
    return keras.Sequential([keras.Input((8,)), L.Dense(16), L.Dropout(0.5), L.GaussianDropout(0.3),
                             L.AlphaDropout(0.2), L.GaussianNoise(0.2), UserNoise(), L.Dense(1)])


def spatial_family():
    inputs = keras.Input((4, 4, 3))
    a = L.SpatialDropout2D(0.5)(L.Conv2D(4, 2)(inputs))
    b = L.SpatialDropout1D(0.5)(L.Reshape((9, 4))(a))
    c = L.SpatialDropout3D(0.5)(L.Reshape((3, 3, 1, 4))(b))
    return keras.Model(inputs, L.Dense(1)(L.Activation("tanh")(L.Flatten()(c))))


def attention():
    inputs = keras.Input((4, 8))
    x = L.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.3)(inputs, inputs)
    return keras.Model(inputs, L.Dense(1)(L.GlobalAveragePooling1D()(x)))


def augmentation():
    inputs = keras.Input((8, 8, 3))
    x = L.RandomFlip()(inputs)
    x = L.RandomRotation(0.2)(x)
    x = L.RandomTranslation(0.2, 0.2)(x)
    x = L.RandomZoom(0.2)(x)
    x = L.RandomContrast(0.3, value_range=(-4, 6))(x)
    x = L.RandomBrightness(0.2, value_range=(-4, 6))(x)
    x = L.RandomCrop(6, 6)(x)
    return keras.Model(inputs, L.Dense(1)(L.GlobalAveragePooling2D()(L.Conv2D(4, 3)(x))))


def batch_norm(synchronized=False):
    def build():
        inputs = keras.Input((4, 4, 3))
        x = L.BatchNormalization(synchronized=synchronized)(L.Conv2D(4, 2)(inputs))
        x = L.BatchNormalization(synchronized=synchronized)(L.Dense(6)(L.Flatten()(L.ReLU()(x))))
        return keras.Model(inputs, L.Dense(1)(x))
    return build


def residual_cnn():
    inputs = keras.Input((4, 4, 3))
    x = L.ReLU()(L.BatchNormalization()(L.Conv2D(4, 2, padding="same")(inputs)))
    y = L.BatchNormalization()(L.Conv2D(4, 1)(inputs))
    x = L.Dropout(0.3)(L.Add()([x, y]))
    return keras.Model(inputs, L.Dense(1)(L.GlobalAveragePooling2D()(x)))


STEPS_PER_EXECUTION = {"residual_cnn_bn_dropout_3_steps_per_execution": 3}
CASES = {  # name -> (builder, input shape)
    "dense_dropout_family": (dense_family, (8,)),
    "spatial_dropout": (spatial_family, (4, 4, 3)),
    "attention_dropout": (attention, (4, 8)),
    "augmentation": (augmentation, (8, 8, 3)),
    "batch_norm": (batch_norm(), (4, 4, 3)),
    "batch_norm_synchronized": (batch_norm(True), (4, 4, 3)),
    "residual_cnn_bn_dropout": (residual_cnn, (4, 4, 3)),
    # several steps per call of the train function (the last call runs 1 step of the 4 per epoch)
    "residual_cnn_bn_dropout_3_steps_per_execution": (residual_cnn, (4, 4, 3)),
}


def data(shape):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(SAMPLES,) + shape).astype(np.float32)
    x[SAMPLES // 2:] += 2.0  # the halves of a global batch differ in mean: local statistics would show
    y = rng.normal(size=(SAMPLES, 1)).astype(np.float32)
    return x, y


def train(builder, shape, wrapped, steps_per_execution=1):
    keras.utils.set_random_seed(11)
    model = builder()
    if wrapped:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=steps_per_execution)
    x, y = data(shape)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    inner = model.wrapped_model if wrapped else model
    return [np.array(v) for v in inner.variables], history.history["loss"]


selected = sys.argv[1:] or list(CASES)
for name in selected:
    builder, shape = CASES[name]
    steps = STEPS_PER_EXECUTION.get(name, 1)
    serial, serial_loss = train(builder, shape, False, steps)
    distributed, loss = train(builder, shape, True, steps)
    found = max(elementwise_difference(distributed, serial), elementwise_difference([loss], [serial_loss]))
    print(f"RESULT {name} {found:.3e} {identical_on_ranks(distributed)}", flush=True)
