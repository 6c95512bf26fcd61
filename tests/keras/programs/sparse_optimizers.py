"""Run on N ranks: a model with token + position Embeddings (sparse gradients) trained with optimizers that
apply sparse gradients slice by slice (Adam, RMSprop, Adagrad) by tnt.Model's fit,
by a model's own train_step, and by a custom loop with tnt.reduce_gradients, each against serial Keras in
this process (Note [Sparse gradients stay sparse] in tarantella/step/sparse_gradients.py); one
`RESULT <json>` line per check. tests/keras/test_own_training_logic.py reads them."""
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers, ops  # noqa: E402

import tarantella as tnt  # noqa: E402
from serial_comparison import logs_difference, relative_difference, report  # noqa: E402

VOCAB, MAXLEN, EMBED, EPOCHS = 30, 6, 8, 2
rng = np.random.default_rng(3)
tokens = rng.integers(0, VOCAB, size=(65, MAXLEN)).astype("int32")  # few tokens: rows repeat across ranks
labels = rng.integers(0, 2, size=65)
text = tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(16)  # 65 = 4 * 16 + 1: an empty micro-batch


class TokenAndPosition(layers.Layer):
    def __init__(self):
        super().__init__()
        self.token_emb = layers.Embedding(VOCAB, EMBED)
        self.pos_emb = layers.Embedding(MAXLEN, EMBED)

    def call(self, x):
        return self.token_emb(x) + self.pos_emb(ops.arange(0, ops.shape(x)[-1]))


class OwnStep(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def make(cls=keras.Model):
    keras.utils.set_random_seed(5)
    inputs = layers.Input(shape=(MAXLEN,), dtype="int32")
    h = layers.GlobalAveragePooling1D()(TokenAndPosition()(inputs))
    return cls(inputs, layers.Dense(2, activation="softmax")(layers.Dense(8, activation="relu")(h)))


OPTIMIZERS = {"adam": lambda: keras.optimizers.Adam(0.05),
              "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
              "adagrad": lambda: keras.optimizers.Adagrad(0.5)}


def compare_fit(check, optimizer, cls=keras.Model):
    models = [make(cls), tnt.Model(make(cls))]
    for model in models:
        model.compile(optimizer=OPTIMIZERS[optimizer](), loss="sparse_categorical_crossentropy")
    serial, distributed = (model.fit(text, epochs=EPOCHS, verbose=0) for model in models)
    report(check, weights=relative_difference(models[0].get_weights(), models[1].get_weights()),
           logs=logs_difference(serial, distributed),
           finite=all(bool(np.all(np.isfinite(w))) for w in models[1].get_weights()))


for name in OPTIMIZERS:
    compare_fit(f"fit_{name}", name)
compare_fit("own_train_step_adam", "adam", OwnStep)


def custom_loop(distributed: bool):
    model, optimizer = make(), OPTIMIZERS["adam"]()
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(batch, share):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        if distributed:
            gradients = tnt.reduce_gradients(gradients, model.trainable_variables, share=share)
        optimizer.apply(gradients, model.trainable_variables)

    dataset = tnt.distribute_dataset(text) if distributed else text.map(lambda x, y: ((x, y), 1.0))
    for _ in range(EPOCHS):
        for batch, share in dataset:
            step(batch, share)
    return model.get_weights()


report("custom_loop_adam", weights=relative_difference(custom_loop(False), custom_loop(True)), logs=0.0,
       finite=True)
