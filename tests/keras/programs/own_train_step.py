"""A model with its own train_step, as keras.io's "Customizing what happens in fit()" writes it (the sharding test
programs train it unsharded and sharded)."""
import keras
import tensorflow as tf


class OwnStep(keras.Model):
    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=inputs, y=targets, y_pred=self(inputs, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}
