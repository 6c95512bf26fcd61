"""Run on N ranks: models with their own training logic (compute_loss / train_step / test_step /
predict_step overrides, a GAN with two optimizers on sklearn digits) trained by tnt.Model against the
same models trained by serial Keras in this process; one `RESULT <json>` line per check.
tests/keras/test_own_training_logic.py reads them."""
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tarantella as tnt  # noqa: E402
from serial_comparison import elementwise_difference, logs_difference, relative_difference, report  # noqa: E402
from zoo.generative import VAE, CallableVAE, SamplingByDimensions, vae  # noqa: E402

EPOCHS = 2


class PenalisedLoss(keras.Model):
    """compute_loss override: the compiled loss plus a penalty on the output layer's kernel."""
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return loss + 0.05 * tf.reduce_sum(tf.square(self.layers[-1].kernel))


class CustomFit(keras.Model):
    """keras.io "Customizing what happens in fit()": own train_step, test_step and predict_step."""
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return self.update_metrics(loss, y, y_pred)

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        return self.update_metrics(self.compute_loss(y=y, y_pred=y_pred), y, y_pred)

    def update_metrics(self, loss, y, y_pred):
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def predict_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        return tf.nn.softmax(self(x, training=False))


def functional(cls, seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return cls(inputs, keras.layers.Dense(3)(hidden))


rng = np.random.default_rng(0)
N = 101  # global batch 10: the last batch has 1 sample, so at 2+ ranks some micro-batches are empty
x = rng.normal(size=(N, 8)).astype("float32")
y = rng.integers(0, 3, size=N)


def compile_args():
    return dict(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


for check, cls in (("compute_loss", PenalisedLoss), ("train_test_predict_steps", CustomFit)):
    serial = functional(cls, 1)
    serial.compile(**compile_args())
    distributed = tnt.Model(functional(cls, 1))
    distributed.compile(**compile_args())
    hs = serial.fit(x, y, batch_size=10, epochs=EPOCHS, shuffle=False, validation_data=(x[:33], y[:33]), verbose=0)
    hd = distributed.fit(x, y, batch_size=10, epochs=EPOCHS, shuffle=False, validation_data=(x[:33], y[:33]),
                         verbose=0)
    evaluation = [serial.evaluate(x, y, batch_size=9, verbose=0), distributed.evaluate(x, y, batch_size=9, verbose=0)]
    # CustomFit's loss tracker is updated without sample weights (metric.update_state(loss)) and the
    # micro-batches are unequal (10 = 5 + 5, but 1 = 1 + 0, and 9 = 5 + 4 in evaluate): the logged and
    # evaluated losses must still be serial's (Note [Means of whole micro-batches]).
    predictions = [serial.predict(x, batch_size=9, verbose=0), distributed.predict(x, batch_size=9, verbose=0)]
    report(check, weights=relative_difference(serial.get_weights(), distributed.get_weights()),
           logs=logs_difference(hs, hd), keys=sorted(hd.history), all_logs=hd.history,
           evaluate=relative_difference([np.asarray(evaluation[0])], [np.asarray(evaluation[1])]),
           predict=relative_difference([predictions[0]], [predictions[1]]),
           predict_shape=list(predictions[1].shape))


# A GAN on sklearn digits (keras.io "DCGAN" pattern, dense): its own compile(d_optimizer, g_optimizer,
# loss_fn), two optimizers, Mean trackers as metrics. Each sample carries its latent vector, so the
# generator's input is the same in serial and distributed training (random noise would differ per rank).
LATENT = 8


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, data):
        real, latent = data
        n = tf.shape(real)[0]
        fake = self.generator(latent)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss, sample_weight=n)
        self.g_loss_tracker.update_state(g_loss, sample_weight=n)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def gan():
    keras.utils.set_random_seed(7)
    discriminator = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32), keras.layers.LeakyReLU(0.2),
                                      keras.layers.Dense(1)])
    generator = keras.Sequential([keras.Input((LATENT,)), keras.layers.Dense(32), keras.layers.LeakyReLU(0.2),
                                  keras.layers.Dense(64, activation="sigmoid")])
    model = GAN(discriminator, generator)
    model.compile(d_optimizer=keras.optimizers.Adam(3e-3), g_optimizer=keras.optimizers.Adam(3e-3),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


digits = (load_digits().data[:300] / 16.0).astype("float32")
latents = np.random.default_rng(1).normal(size=(len(digits), LATENT)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((digits, latents)).batch(32)  # 300 = 9 * 32 + 12
serial = gan()
hs = serial.fit(dataset, epochs=EPOCHS, verbose=0)
distributed = tnt.Model(gan())
hd = distributed.fit(dataset, epochs=EPOCHS, verbose=0)
report("gan", weights=relative_difference(serial.get_weights(), distributed.get_weights()),
       logs=logs_difference(hs, hd), keys=sorted(hd.history), all_logs=hd.history)


# keras.io's DCGAN/VAE-style step fitted on inputs alone, returning its own loss beside another value and
# compiled with an optimizer only: Keras's loss tracker (also named "loss") is never updated, and since the
# logs' keys differ from the metrics' Keras reports the step's logs (Trainer._get_metrics_result_or_logs),
# so the history holds the step's own loss, in serial and distributed training alike. Also in float64, whose
# logs must not pass through float32.
class OwnLossBesideOthers(keras.Model):
    def train_step(self, real):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(real, training=True) - 1.0))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss, "out": tf.reduce_mean(self(real))}


def own_loss_run(wrap, inputs, dtype):
    keras.utils.set_random_seed(5)
    model_inputs = keras.Input((8,), dtype=dtype)
    model = wrap(OwnLossBesideOthers(model_inputs, keras.layers.Dense(1, dtype=dtype)(
        keras.layers.Dense(6, activation="tanh", dtype=dtype)(model_inputs))))
    model.compile(optimizer="sgd")
    history = model.fit(inputs, epochs=EPOCHS, verbose=0, **({} if isinstance(inputs, tf.data.Dataset)
                                                             else dict(batch_size=10, shuffle=False)))
    return model, history


for dtype in ("float32", "float64"):
    inputs = x.astype(dtype)
    for kind, data in (("arrays", inputs), ("dataset", tf.data.Dataset.from_tensor_slices(inputs).batch(12))):
        serial, hs = own_loss_run(lambda model: model, data, dtype)
        distributed, hd = own_loss_run(tnt.Model, data, dtype)
        report(f"own_loss_beside_others_{kind}_{dtype}",
               weights=relative_difference(serial.get_weights(), distributed.get_weights()),
               logs=logs_difference(hs, hd), keys=sorted(hd.history), all_logs=hd.history,
               serial_logs=hs.history)


# Refused before training, with one line saying what and why: a train_step that updates its
# variables itself (no optimizer.apply) cannot be distributed.
class ManualUpdate(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        for variable, gradient in zip(self.trainable_variables, tape.gradient(loss, self.trainable_variables)):
            variable.assign_sub(0.01 * gradient)
        return {"loss": loss}


manual = tnt.Model(functional(ManualUpdate, 3))
manual.compile(**compile_args())
try:
    manual.fit(x, y, batch_size=10, epochs=1, verbose=0)
    report("manual_update", raised=False, message="")
except ValueError as error:
    report("manual_update", raised=True, message=str(error).splitlines()[0])


# keras.io's VAE as written (Sampling draws a (batch, dim) shape from ops.shape), and with a call(): tnt.Model
# builds a callable model before training by calling it, and Sampling draws even at inference, so that call must
# not move its seed state (it did: every later draw differed, 1e-2 in the weights at one rank, issue 44 §3).
# Every variable is compared, seed states included; in float64, where Adam's amplified rounding stays ~1e-12.
keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")  # the policy in use was made from float32 above
for model_class in (VAE, CallableVAE):
    runs = []
    for wrap in (lambda model: model, tnt.Model):
        keras.utils.set_random_seed(11)
        model, history = vae(wrap, model_class, SamplingByDimensions)
        runs.append(([np.asarray(v.numpy()) for v in getattr(model, "wrapped_model", model).variables], history))
    (serial_variables, hs), (variables, hd) = runs
    report(f"vae_{model_class.__name__}", variables=elementwise_difference(variables, serial_variables),
           logs=logs_difference(hs, hd), count=len(variables))
keras.config.set_floatx("float32")
keras.config.set_dtype_policy("float32")
