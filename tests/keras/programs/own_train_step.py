"""A model with its own train_step, as keras.io's "Customizing what happens in fit()" writes it (the sharding test
programs train it unsharded and sharded)."""
import keras
import tensorflow as tf


class TwoOptimizers(keras.Model):
    """Two parts, each with its own optimizer (as a GAN's generator and discriminator), one gradient call."""

    def __init__(self, first: keras.Model, second: keras.Model):
        super().__init__()
        self.first, self.second = first, second

    def call(self, inputs):
        return self.second(self.first(inputs))

    def compile(self, first_optimizer, second_optimizer, **kwargs):
        super().compile(**kwargs)
        self.first_optimizer, self.second_optimizer = first_optimizer, second_optimizer

    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=inputs, y=targets, y_pred=self(inputs, training=True))
        first, second = self.first.trainable_variables, self.second.trainable_variables
        gradients = tape.gradient(loss, first + second)
        self.first_optimizer.apply(gradients[:len(first)], first)
        self.second_optimizer.apply(gradients[len(first):], second)
        return {"loss": loss}


class OwnStep(keras.Model):
    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=inputs, y=targets, y_pred=self(inputs, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}
