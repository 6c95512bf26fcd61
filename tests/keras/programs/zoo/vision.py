"""Image models: keras.io's "Image classification with Vision Transformer" (AdamW with a schedule, an
adapted Normalization and augmentation in the model), "Image classification with modern MLP models"
(MLP-Mixer) and "Image segmentation with a U-Net-like architecture" (BatchNormalization, residuals)."""
import keras
from keras import layers, ops

from zoo.data import BATCH, classes, images

CLASSES, PATCH = 4, 4


class Patches(layers.Layer):
    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, images):
        patches = ops.image.extract_patches(images, size=self.patch_size)
        batch, rows, columns, values = (ops.shape(patches)[i] for i in range(4))
        return ops.reshape(patches, (batch, rows * columns, values))


class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches = num_patches
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(input_dim=num_patches, output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        return self.projection(patch) + self.position_embedding(positions)


def augmentation(x):
    """keras.io's augmentation, without RandomRotation: with floatx float64 (the zoo's test runs so) Keras's
    RandomRotation fails (a float32 factor in its Mul); tests/keras/test_batch_layers.py covers it in float32."""
    augment = keras.Sequential([layers.Normalization(), layers.RandomFlip("horizontal"), layers.RandomZoom(0.2, 0.2)],
                               name="data_augmentation")
    augment.layers[0].adapt(x)
    return augment


def vit(wrap):
    x, y = images((8, 8, 3)), classes(CLASSES)
    inputs = keras.Input((8, 8, 3))
    encoded = PatchEncoder(4, 8)(Patches(PATCH)(augmentation(x)(inputs)))
    for _ in range(2):
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded)
        attention = layers.MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.1)(x1, x1)
        x2 = layers.Add()([attention, encoded])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        for units in (16, 8):
            x3 = layers.Dropout(0.1)(layers.Dense(units, activation=keras.activations.gelu)(x3))
        encoded = layers.Add()([x3, x2])
    representation = layers.Dropout(0.5)(layers.Flatten()(layers.LayerNormalization(epsilon=1e-6)(encoded)))
    features = layers.Dropout(0.5)(layers.Dense(16, activation=keras.activations.gelu)(representation))
    model = wrap(keras.Model(inputs, layers.Dense(CLASSES)(features)))
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=6, warmup_target=2e-3, warmup_steps=2)
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=schedule, weight_decay=1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  # keras.io's top-5 accuracy left out: TensorFlow's InTopK takes no float64 predictions
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model, model.fit(x, y, batch_size=BATCH, epochs=2, validation_split=0.2, verbose=0)


class MLPMixerLayer(layers.Layer):
    def __init__(self, num_patches, hidden_units, dropout_rate, **kwargs):
        super().__init__(**kwargs)
        self.mlp1 = keras.Sequential([layers.Dense(num_patches, activation="gelu"), layers.Dense(num_patches),
                                      layers.Dropout(rate=dropout_rate)])
        self.mlp2 = keras.Sequential([layers.Dense(num_patches, activation="gelu"), layers.Dense(hidden_units),
                                      layers.Dropout(rate=dropout_rate)])
        self.normalize = layers.LayerNormalization(epsilon=1e-6)

    def call(self, inputs):
        x = self.normalize(inputs)
        x = ops.transpose(self.mlp1(ops.transpose(x, axes=(0, 2, 1))), axes=(0, 2, 1)) + inputs
        return x + self.mlp2(self.normalize(x))


def mlp_mixer(wrap):
    x, y = images((8, 8, 3), seed=11), classes(CLASSES, seed=12)
    inputs = keras.Input((8, 8, 3))
    patches = Patches(PATCH)(augmentation(x)(inputs))
    representation = layers.Dense(units=8)(patches)
    for _ in range(2):
        representation = MLPMixerLayer(4, 8, 0.2)(representation)
    representation = layers.Dropout(rate=0.2)(layers.GlobalAveragePooling1D()(representation))
    model = wrap(keras.Model(inputs, layers.Dense(CLASSES)(representation)))
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=0.005, weight_decay=1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])
    callbacks = [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1)]
    return model, model.fit(x, y, batch_size=BATCH, epochs=3, validation_split=0.2, callbacks=callbacks, verbose=0)


def unet(wrap):
    inputs = keras.Input((16, 16, 3))
    x = layers.Activation("relu")(layers.BatchNormalization()(layers.Conv2D(8, 3, strides=2, padding="same")(inputs)))
    previous = x
    for filters in (16,):
        for _ in range(2):
            x = layers.BatchNormalization()(layers.SeparableConv2D(filters, 3, padding="same")(
                layers.Activation("relu")(x)))
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        x = layers.add([x, layers.Conv2D(filters, 1, strides=2, padding="same")(previous)])
        previous = x
    for filters in (16, 8):
        for _ in range(2):
            x = layers.BatchNormalization()(layers.Conv2DTranspose(filters, 3, padding="same")(
                layers.Activation("relu")(x)))
        x = layers.UpSampling2D(2)(x)
        x = layers.add([x, layers.Conv2D(filters, 1, padding="same")(layers.UpSampling2D(2)(previous))])
        previous = x
    model = wrap(keras.Model(inputs, layers.Conv2D(3, 3, activation="softmax", padding="same")(x)))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    masks = classes(3, n=20 * 16 * 16).reshape(20, 16, 16, 1)
    return model, model.fit(images((16, 16, 3)), masks, batch_size=BATCH, epochs=2, verbose=0)


EXAMPLES = {"vit": vit, "mlp_mixer": mlp_mixer, "unet": unet}
