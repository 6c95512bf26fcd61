"""A plain Keras script of the ResNet pattern whose calibration jumps once (issue 44 §1): a residual CNN of
16x16x3 inputs, a stem and two residual blocks of Conv2D(8, 3, use_bias=False) + BatchNormalization + ReLU
(5 BatchNormalization layers), GlobalAveragePooling, Dropout(0.3, seed=3), Dense(4, softmax); SGD(0.05,
momentum=0.9); 256 samples whose batch halves differ in scale. Reversing a batch moves its first step by
~3e-5 (the statistics of halves of other scales summed in another order) and no further, so 16 x the
calibration exceeds float32's cap while the distributed runs stay far within it: a correct run that the
checker must pass (`tnt-repro check --wrap`). --defect plants a bug on rank 1 that the checker must call
DIVERGENT although the calibration exceeds the cap (Note [Undecided] in repro/tolerance.py): its share of the
gradient 1.5 times too large, its gradient dropped (its loss times 0: a rank that stopped its gradient before
the BatchNormalization layers would skip their backward allreduces and hang its peers until the engine's
timeout instead), its own BatchNormalization statistics, or other start weights (its first kernel 1 % off
after tarantella gave every rank the master's).

    residual_bn_jump.py [--defect wrong-share|dropped-gradient|local-batch-norm|other-start-weights]
"""
import argparse
import os

import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--defect", choices=["wrong-share", "dropped-gradient", "local-batch-norm", "other-start-weights"])
args = parser.parse_args()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
planted = args.defect if rank == 1 else None

keras.utils.set_random_seed(7)
L = keras.layers


def loss(y_true, y_pred):
    share = {"wrong-share": 1.5, "dropped-gradient": 0.0}.get(planted, 1.0)
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred) * share


class OtherStartWeights(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        if planted == "other-start-weights":
            kernel = self.model.trainable_variables[0]
            kernel.assign(kernel * 1.01)


def conv_bn(x, relu=True):
    x = L.BatchNormalization()(L.Conv2D(8, 3, padding="same", use_bias=False)(x))
    return L.ReLU()(x) if relu else x


inputs = keras.Input((16, 16, 3))
x = conv_bn(inputs)
for _ in range(2):
    x = L.ReLU()(L.Add()([x, conv_bn(conv_bn(x), relu=False)]))
x = L.Dropout(0.3, seed=3)(L.GlobalAveragePooling2D()(x))
model = keras.Model(inputs, L.Dense(4, activation="softmax")(x))
if args.defect == "local-batch-norm":
    import tarantella as tnt
    model = tnt.Model(model, batch_norm="local")
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=loss, metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 16, 16, 3)).astype(np.float32)
x[np.arange(256) % 32 >= 16] *= 2   # the halves of every batch differ in scale
y = rng.integers(0, 4, 256).astype(np.int32)
model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[OtherStartWeights()])
