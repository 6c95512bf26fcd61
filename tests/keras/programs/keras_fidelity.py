"""Run on N ranks: keras.io-style architectures (text: token + position Embedding with
MultiHeadAttention; images: Conv + BatchNorm + pooling; tabular: several inputs with preprocessing
layers), empty micro-batches in fit/evaluate/predict, class_weight with tf.data, and the refusals;
one `RESULT <json>` line per check. tests/keras/test_keras_fidelity.py reads them."""
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

import tarantella as tnt  # noqa: E402
from serial_comparison import RANK, SIZE, logs_difference, relative_difference, report  # noqa: E402
from zoo.text import TokenAndPositionEmbedding  # noqa: E402  (keras.io's, one home for it)
EPOCHS = 2
rng = np.random.default_rng(0)



def all_finite(model):
    return all(bool(np.all(np.isfinite(w))) for w in model.get_weights())


def compare(check, make, train, validation, evaluate_data, predict_x, compile_kwargs, serial_equal=True, **fit):
    serial = make()
    serial.compile(**compile_kwargs())
    distributed = tnt.Model(make())
    distributed.compile(**compile_kwargs())
    hs = serial.fit(train, epochs=EPOCHS, validation_data=validation, verbose=0, **fit)
    hd = distributed.fit(train, epochs=EPOCHS, validation_data=validation, verbose=0, **fit)
    evaluation = [np.asarray(m.evaluate(evaluate_data, verbose=0)) for m in (serial, distributed)]
    predictions = [m.predict(predict_x, verbose=0) for m in (serial, distributed)]
    report(check, weights=relative_difference(serial.get_weights(), distributed.get_weights()),
           logs=logs_difference(hs, hd), evaluate=relative_difference([evaluation[0]], [evaluation[1]]),
           predict=relative_difference([predictions[0]], [predictions[1]]), predict_rows=len(predictions[1]),
           finite=all_finite(distributed), serial_equal=serial_equal,
           equal_on_ranks=all([np.array_equal(w, tnt.broadcast(w.copy()))
                               for w in (v.numpy() for v in distributed.trainable_variables)]))
    return distributed


# 1. keras.io "Text classification with Transformer" (dropout 0: dropout draws per rank). Optimizers that
# apply the embeddings' sparse gradients slice by slice (Adam, RMSprop) are tested in sparse_optimizers.py.
VOCAB, MAXLEN, EMBED = 200, 12, 16


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.norm1, self.norm2 = layers.LayerNormalization(epsilon=1e-6), layers.LayerNormalization(epsilon=1e-6)

    def call(self, inputs):
        out1 = self.norm1(inputs + self.att(inputs, inputs))
        return self.norm2(out1 + self.ffn(out1))


def transformer():
    keras.utils.set_random_seed(11)
    inputs = layers.Input(shape=(MAXLEN,))
    h = TransformerBlock(EMBED, 2, 16)(TokenAndPositionEmbedding(MAXLEN, VOCAB, EMBED)(inputs))
    h = layers.Dense(8, activation="relu")(layers.GlobalAveragePooling1D()(h))
    return keras.Model(inputs, layers.Dense(2, activation="softmax")(h))


def text_compile():
    return dict(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])


tokens = rng.integers(0, VOCAB, size=(65, MAXLEN)).astype("int32")  # 65 = 4 * 16 + 1: an empty micro-batch
labels = rng.integers(0, 2, size=65)
text = tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(16)
compare("text_transformer", transformer, text, text.take(2), text, tokens, text_compile)


# 2. Images: LeNet-style Conv + BatchNorm + MaxPooling; the data set ends with a 1-sample batch.
def lenet(batch_norm):
    def make():
        keras.utils.set_random_seed(12)
        stack = [keras.Input((12, 12, 1)), layers.Conv2D(4, 3, activation="relu")]
        stack += [layers.BatchNormalization()] if batch_norm else []
        stack += [layers.MaxPooling2D(), layers.Conv2D(6, 3, activation="relu"), layers.MaxPooling2D(),
                  layers.Flatten(), layers.Dense(10)]
        return keras.Sequential(stack)
    return make


def image_compile():
    return dict(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


images = rng.normal(size=(49, 12, 12, 1)).astype("float32")  # 49 = 3 * 16 + 1
digits = rng.integers(0, 10, size=49)
cnn_train = tf.data.Dataset.from_tensor_slices((images, digits)).batch(16)
compare("images_lenet", lenet(False), cnn_train, cnn_train, cnn_train, images, image_compile)
with_bn = compare("images_batch_norm", lenet(True), cnn_train, cnn_train, cnn_train, images, image_compile,
                  serial_equal=SIZE == 1)
moving = [v.numpy() for v in with_bn.non_trainable_variables]
report("batch_norm_moving_stats", finite=all(bool(np.all(np.isfinite(m))) for m in moving), count=len(moving))


# 3. Tabular (keras.io structured data): numeric and categorical inputs, Normalization and
# IntegerLookup preprocessing inside the model, sample counts that leave empty micro-batches.
ages = rng.normal(50, 10, size=(67, 1)).astype("float32")
kinds = rng.integers(0, 5, size=(67, 1)).astype("int64")
targets = (ages[:, 0] / 50 + kinds[:, 0] % 2 > 1.3).astype("float32")[:, None]


def tabular():
    keras.utils.set_random_seed(13)
    age, kind = keras.Input((1,), name="age"), keras.Input((1,), name="kind", dtype="int64")
    norm = layers.Normalization()
    norm.adapt(ages)
    lookup = layers.IntegerLookup(vocabulary=[0, 1, 2, 3, 4], output_mode="one_hot")
    h = layers.Concatenate()([norm(age), lookup(kind)])
    h = layers.Dense(8, activation="relu")(h)
    return keras.Model({"age": age, "kind": kind}, layers.Dense(1, activation="sigmoid")(h))


def tabular_compile():
    return dict(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["accuracy"])


table = tf.data.Dataset.from_tensor_slices(({"age": ages, "kind": kinds}, targets)).batch(22)  # 67 = 3 * 22 + 1
compare("tabular", tabular, table, table, table, {"age": ages, "kind": kinds}, tabular_compile)


# 4. class_weight with a tf.data dataset, Keras's rules (labels rounded), against serial Keras.
def small():
    keras.utils.set_random_seed(14)
    return keras.Sequential([keras.Input((12, 12, 1)), layers.Flatten(), layers.Dense(10)])


weights = {0: 2.0, 3: 0.5, 9: 3.0}
float_labels = tf.data.Dataset.from_tensor_slices((images, digits.astype("float32") + 0.2)).batch(16)
compare("class_weight_dataset", small, float_labels, None, cnn_train, images, image_compile, class_weight=weights)

# 5. Refusals, each one line.
refusals = {}
try:
    tnt.Model(small()).compile(optimizer="sgd", loss="mse", jit_compile=True)
except ValueError as error:
    refusals["jit_compile"] = str(error)
two_outputs_input = keras.Input((3,))
two_outputs = keras.Model(two_outputs_input, [layers.Dense(2)(two_outputs_input), layers.Dense(2)(two_outputs_input)])
two = tnt.Model(two_outputs)
two.compile(optimizer="sgd", loss=["sparse_categorical_crossentropy"] * 2)
pairs = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), (np.zeros(8), np.zeros(8)))).batch(4)
try:
    two.fit(pairs, class_weight={0: 1.0}, verbose=0)
except Exception as error:  # noqa: BLE001  (tf.data may wrap it)
    refusals["class_weight_outputs"] = str(error)
try:
    tnt.Model(small()).compile(optimizer="sgd", loss=keras.losses.MeanSquaredError(reduction="sum"))
except ValueError as error:
    refusals["loss_reduction"] = str(error)
report("refusals", messages={key: value.splitlines()[0] for key, value in refusals.items()},
       lines={key: len(value.strip().splitlines()) for key, value in refusals.items()})
