"""Models that learn from other signals than labels: keras.io's "Self-supervised contrastive learning with
SimSiam" (two augmented views), "Knowledge Distillation" (a Distiller with its own compile and compute_loss)
and "Image similarity estimation using a Siamese Network with a contrastive loss"."""
import keras
import tensorflow as tf
from keras import layers, ops

from zoo.data import BATCH, classes, images


class SimSiam(keras.Model):
    """Two augmentations of each image; negative cosine similarity, stop-gradient on the target branch."""

    def __init__(self, encoder, predictor, augment):
        super().__init__()
        self.encoder = encoder
        self.predictor = predictor
        self.augment = augment
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.loss_tracker]

    @staticmethod
    def negative_cosine(p, z):
        z = ops.stop_gradient(z)
        p, z = [x / ops.maximum(ops.norm(x, axis=1, keepdims=True), 1e-12) for x in (p, z)]
        return -ops.mean(ops.sum(p * z, axis=1))

    def train_step(self, data):
        view_one, view_two = self.augment(data, training=True), self.augment(data, training=True)
        with tf.GradientTape() as tape:
            z1, z2 = self.encoder(view_one), self.encoder(view_two)
            p1, p2 = self.predictor(z1), self.predictor(z2)
            loss = self.negative_cosine(p1, z2) / 2 + self.negative_cosine(p2, z1) / 2
        variables = self.encoder.trainable_variables + self.predictor.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def simsiam(wrap):
    augment = keras.Sequential([layers.RandomFlip("horizontal"), layers.RandomTranslation(0.2, 0.2),
                                layers.RandomContrast(0.3)], name="augment")
    inputs = keras.Input((8, 8, 3))
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(inputs)))
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.BatchNormalization()(layers.Dense(8)(x))
    encoder = keras.Model(inputs, x, name="encoder")
    predictor = keras.Sequential([keras.Input((8,)), layers.Dense(4), layers.BatchNormalization(), layers.ReLU(),
                                  layers.Dense(8)], name="predictor")
    model = wrap(SimSiam(encoder, predictor, augment))
    model.compile(optimizer=keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(0.05, 10), momentum=0.6))
    return model, model.fit(images((8, 8, 3)), epochs=2, batch_size=BATCH, verbose=0)


class Distiller(keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)
        distillation_loss = self.distillation_loss_fn(
            ops.softmax(teacher_pred / self.temperature, axis=1),
            ops.softmax(y_pred / self.temperature, axis=1)) * (self.temperature ** 2)
        return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

    def call(self, x):
        return self.student(x)


def distiller(wrap):
    def classifier(width, name):
        return keras.Sequential([keras.Input((8, 8, 1)), layers.Conv2D(width, 3, strides=2, padding="same"),
                                 layers.LeakyReLU(0.2), layers.MaxPooling2D(2, padding="same"), layers.Flatten(),
                                 layers.Dense(5)], name=name)
    x, y = images((8, 8, 1)), classes(5)
    teacher = wrap(classifier(16, "teacher"))
    teacher.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.SparseCategoricalCrossentropy(True),
                    metrics=[keras.metrics.SparseCategoricalAccuracy()])
    teacher.fit(x, y, epochs=2, batch_size=BATCH, verbose=0)
    model = wrap(Distiller(student=classifier(4, "student"), teacher=teacher))
    model.compile(optimizer=keras.optimizers.Adam(), metrics=[keras.metrics.SparseCategoricalAccuracy()],
                  student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  distillation_loss_fn=keras.losses.KLDivergence(), alpha=0.1, temperature=10)
    return model, model.fit(x, y, epochs=2, batch_size=BATCH, verbose=0)


def contrastive_loss(margin=1):
    def loss(y_true, y_pred):
        square_pred = ops.square(y_pred)
        margin_square = ops.square(ops.maximum(margin - y_pred, 0))
        return ops.mean((1 - y_true) * square_pred + y_true * margin_square)
    return loss


def euclidean_distance(vectors):
    x, y = vectors
    sum_square = ops.sum(ops.square(x - y), axis=1, keepdims=True)
    return ops.sqrt(ops.maximum(sum_square, keras.backend.epsilon()))


def siamese(wrap):
    inputs = keras.Input((8, 8, 1))
    x = layers.BatchNormalization()(inputs)
    x = layers.AveragePooling2D(pool_size=(2, 2))(layers.Conv2D(4, (3, 3), activation="tanh")(x))
    x = layers.Dense(6, activation="tanh")(layers.BatchNormalization()(layers.Flatten()(x)))
    embedding_network = keras.Model(inputs, x)
    input_1, input_2 = keras.Input((8, 8, 1)), keras.Input((8, 8, 1))
    merged = layers.Lambda(euclidean_distance, output_shape=(1,))([embedding_network(input_1),
                                                                   embedding_network(input_2)])
    output = layers.Dense(1, activation="sigmoid")(layers.BatchNormalization()(merged))
    model = wrap(keras.Model(inputs=[input_1, input_2], outputs=output))
    model.compile(loss=contrastive_loss(margin=1), optimizer="RMSprop", metrics=["accuracy"])
    pairs, labels = [images((8, 8, 1), seed=s) for s in (5, 6)], classes(2).astype("float32")
    validation = ([images((8, 8, 1), n=6, seed=s) for s in (7, 8)], classes(2, n=6, seed=9).astype("float32"))
    return model, model.fit(pairs, labels, validation_data=validation, batch_size=BATCH, epochs=2, verbose=0)


EXAMPLES = {"simsiam": simsiam, "distiller": distiller, "siamese": siamese}
