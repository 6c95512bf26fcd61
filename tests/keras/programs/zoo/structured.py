"""Tabular and timeseries models: keras.io's "Structured data classification from scratch" (named string and
numeric inputs, preprocessing layers adapted before wrapping, a tf.data pipeline of dicts, EarlyStopping)
and "Timeseries classification from scratch" (Conv1D with BatchNormalization, ReduceLROnPlateau,
EarlyStopping, validation_split)."""
import keras
import numpy as np
import tensorflow as tf
from keras import layers

from zoo.data import BATCH, SAMPLES, classes, normal


def table(n, seed):
    rng = np.random.default_rng(seed)
    features = {"sex": rng.choice(["male", "female"], n), "thal": rng.choice(["fixed", "normal", "reversible"], n),
                "age": rng.normal(50, 9, n).astype("float32"), "chol": rng.normal(240, 50, n).astype("float32")}
    return features, rng.integers(0, 2, n).astype("float32")


def structured_data(wrap):
    features, target = table(SAMPLES, 1)
    train = tf.data.Dataset.from_tensor_slices((features, target)).batch(BATCH)
    validation = tf.data.Dataset.from_tensor_slices(table(8, 2)).batch(BATCH)
    inputs, encoded = [], []
    for name in ("sex", "thal"):
        feature = keras.Input(shape=(1,), name=name, dtype="string")
        lookup = layers.StringLookup(output_mode="one_hot")
        lookup.adapt(train.map(lambda x, y, name=name: x[name][:, None]))
        inputs.append(feature)
        encoded.append(lookup(feature))
    for name in ("age", "chol"):
        feature = keras.Input(shape=(1,), name=name)
        normalizer = layers.Normalization()
        normalizer.adapt(train.map(lambda x, y, name=name: x[name][:, None]))
        inputs.append(feature)
        encoded.append(normalizer(feature))
    x = layers.Dropout(0.5)(layers.Dense(8, activation="relu")(layers.concatenate(encoded)))
    model = wrap(keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x)))
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", patience=1),
                 keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1)]
    return model, model.fit(train.map(lambda x, y: ({k: v[:, None] for k, v in x.items()}, y)), epochs=3,
                            validation_data=validation.map(lambda x, y: ({k: v[:, None] for k, v in x.items()}, y)),
                            callbacks=callbacks, verbose=0)


def timeseries_conv1d(wrap):
    inputs = keras.Input((16, 1))
    x = inputs
    for _ in range(3):
        x = layers.ReLU()(layers.BatchNormalization()(layers.Conv1D(filters=8, kernel_size=3, padding="same")(x)))
    model = wrap(keras.Model(inputs, layers.Dense(3, activation="softmax")(layers.GlobalAveragePooling1D()(x))))
    callbacks = [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_lr=1e-4),
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, verbose=0)]
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["sparse_categorical_accuracy"])
    return model, model.fit(normal((16, 1)), classes(3), batch_size=BATCH, epochs=3, callbacks=callbacks,
                            validation_split=0.2, verbose=0)


EXAMPLES = {"structured_data": structured_data, "timeseries_conv1d": timeseries_conv1d}
