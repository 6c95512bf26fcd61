"""Models with more than one loss: keras.io's multi-input, multi-output ticket classifier (the functional API
guide: dicts of losses and loss weights) and a model of the subclassing guides (a layer's `add_loss`, a
kernel regularizer, its own train/test steps with metric trackers)."""
import keras
import tensorflow as tf
from keras import layers, ops

from zoo.data import BATCH, classes, images, normal, tokens

WORDS, TAGS, DEPARTMENTS = 40, 6, 3


def multi_output(wrap):
    title_input = keras.Input(shape=(None,), name="title")
    body_input = keras.Input(shape=(None,), name="body")
    tags_input = keras.Input(shape=(TAGS,), name="tags")
    title_features = layers.LSTM(8)(layers.Embedding(WORDS, 8)(title_input))
    body_features = layers.LSTM(4)(layers.Embedding(WORDS, 8)(body_input))
    x = layers.concatenate([title_features, body_features, tags_input])
    model = wrap(keras.Model(inputs=[title_input, body_input, tags_input],
                             outputs={"priority": layers.Dense(1, name="priority")(x),
                                      "department": layers.Dense(DEPARTMENTS, name="department")(x)}))
    model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                  loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True),
                        "department": keras.losses.CategoricalCrossentropy(from_logits=True)},
                  loss_weights={"priority": 1.0, "department": 0.2})
    inputs = {"title": tokens(WORDS, 10, seed=1), "body": tokens(WORDS, 16, seed=2),
              "tags": (images((TAGS,), seed=3) > 0.5).astype("float32")}
    targets = {"priority": images((1,), seed=4), "department": keras.utils.to_categorical(classes(DEPARTMENTS), 3)}
    return model, model.fit(inputs, targets, epochs=2, batch_size=BATCH, verbose=0)


class ActivityRegularizationLayer(layers.Layer):
    def __init__(self, rate=1e-2):
        super().__init__()
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * ops.mean(inputs))
        return inputs


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = ops.mean(keras.losses.mean_squared_error(y, y_pred)) + ops.sum(self.losses)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(ops.mean(keras.losses.mean_squared_error(y, y_pred)))
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}


def add_loss_and_trackers(wrap):
    inputs = keras.Input((8,))
    x = ActivityRegularizationLayer()(layers.Dense(16, activation="relu")(inputs))
    x = layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3))(x)
    model = wrap(CustomModel(inputs, layers.Dense(1)(x)))
    model.compile(optimizer="adam")
    x, y = normal((8,), seed=5), normal((1,), seed=6)
    return model, model.fit(x, y, epochs=2, batch_size=BATCH, validation_data=(normal((8,), n=6, seed=7),
                                                                             normal((1,), n=6, seed=8)), verbose=0)


EXAMPLES = {"multi_output": multi_output, "add_loss_and_trackers": add_loss_and_trackers}
