"""Generative models fitted on images alone: keras.io's DCGAN ("GAN overriding Model.train_step"), its
"Variational AutoEncoder" and its "Convolutional autoencoder for image denoising"."""
import keras
import tensorflow as tf
from keras import layers, ops

from zoo.data import BATCH, images

LATENT = 4


class GAN(keras.Model):
    """keras.io's GAN: two optimizers, its own compile, a step that reads the batch size off the images."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        latent = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated = self.generator(latent)
        combined = ops.concatenate([generated, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        # keras.io's label noise, drawn for each half: a draw of 2 * batch rows has no per-sample serial layout
        noise = [keras.random.uniform((batch_size, 1), seed=self.seed_generator) for _ in range(2)]
        labels += 0.05 * ops.concatenate(noise, axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        latent = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(misleading_labels, self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def dcgan(wrap):
    discriminator = keras.Sequential([
        keras.Input((8, 8, 1)), layers.Conv2D(8, 3, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(8, 3, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.GlobalMaxPooling2D(), layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([
        keras.Input((LATENT,)), layers.Dense(4 * 4 * 8), layers.LeakyReLU(0.2), layers.Reshape((4, 4, 8)),
        layers.Conv2DTranspose(8, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(1, 3, padding="same", activation="sigmoid")], name="generator")
    gan = wrap(GAN(discriminator, generator, LATENT))
    gan.compile(d_optimizer=keras.optimizers.Adam(3e-4), g_optimizer=keras.optimizers.Adam(3e-4),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return gan, gan.fit(images((8, 8, 1)), batch_size=BATCH, epochs=2, verbose=0)


class Sampling(layers.Layer):
    """z = z_mean + exp(z_log_var / 2) * epsilon, one epsilon per sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(shape=ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class SamplingByDimensions(Sampling):
    """keras.io's Sampling as written today: the draw's shape is (batch, dim), each from ops.shape."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch, dim = ops.shape(z_mean)[0], ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(keras.losses.binary_crossentropy(data, reconstruction),
                                                   axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


class CallableVAE(VAE):
    """The VAE with a call() (to predict, or to save it built): a model tnt.Model builds before training by calling
    it, where Sampling draws even at inference."""

    def call(self, inputs):
        return self.decoder(self.encoder(inputs)[2])


def vae(wrap, model_class=VAE, sampling=Sampling):
    encoder_inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Dense(8, activation="relu")(layers.Flatten()(x))
    z_mean = layers.Dense(2, name="z_mean")(x)
    z_log_var = layers.Dense(2, name="z_log_var")(x)
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, sampling()([z_mean, z_log_var])], name="encoder")
    latent_inputs = keras.Input((2,))
    x = layers.Reshape((4, 4, 4))(layers.Dense(4 * 4 * 4, activation="relu")(latent_inputs))
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
    decoder = keras.Model(latent_inputs, layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x),
                          name="decoder")
    model = wrap(model_class(encoder, decoder))
    model.compile(optimizer=keras.optimizers.Adam())
    return model, model.fit(images((8, 8, 1)), epochs=2, batch_size=BATCH, verbose=0)


def denoising_autoencoder(wrap):
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(8, 3, activation="relu", padding="same")(inputs)
    x = layers.MaxPooling2D(2, padding="same")(x)
    x = layers.Conv2D(8, 3, activation="relu", padding="same")(x)
    x = layers.Conv2DTranspose(8, 3, strides=2, activation="relu", padding="same")(x)
    autoencoder = wrap(keras.Model(inputs, layers.Conv2D(1, 3, activation="sigmoid", padding="same")(x)))
    autoencoder.compile(optimizer="adam", loss="binary_crossentropy")
    clean, clean_test = images((8, 8, 1)), images((8, 8, 1), n=6, seed=9)
    noisy, noisy_test = [(a + 0.4 * images((8, 8, 1), n=len(a), seed=4)).clip(0, 1) for a in (clean, clean_test)]
    return autoencoder, autoencoder.fit(noisy, clean, epochs=2, batch_size=BATCH, shuffle=True,
                                        validation_data=(noisy_test, clean_test), verbose=0)


EXAMPLES = {"dcgan": dcgan, "vae": vae, "denoising_autoencoder": denoising_autoencoder}
