"""A two-branch model whose backprop order differs from its variable order, trained with the timeline on:
the shallow branch (created first, so registered LAST) has its gradient long before the deep branch's first
layer. Also checks, in the traced step's graph, that no start op waits for another one."""
import json
import sys

import numpy as np

import tarantella as tnt

tnt.init()
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.utils.set_random_seed(3)


class TwoBranch(keras.Model):
    """Variables in attribute order: shallow first, so it is registered LAST (reverse order), while
    backprop produces its gradient right after out's, long before deep0's."""

    def __init__(self):
        super().__init__()
        self.shallow = keras.layers.Dense(8, name="shallow")
        self.deep = [keras.layers.Dense(1024, activation="relu", name=f"deep{i}") for i in range(4)]
        self.out = keras.layers.Dense(4, name="out")

    def call(self, x):
        deep = x
        for layer in self.deep:
            deep = layer(deep)
        return self.out(keras.ops.concatenate([self.shallow(x), deep], axis=-1))


model = tnt.Model(TwoBranch())
model.compile(optimizer=keras.optimizers.SGD(0.001), jit_compile=False,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).normal(size=(128 * 5, 256)).astype("float32")
y = (np.arange(128 * 5) % 4).astype("int64")
model.fit(x, y, batch_size=128, epochs=1, verbose=0)

names = [v.path for v in model.trainable_variables]
print("VARIABLES " + json.dumps(names), flush=True)

# The traced graph: no start op has another start op among its control inputs, and the sums are right.
from tarantella.keras.graph_allreduce import GraphAllreducer  # noqa: E402

allreducer = GraphAllreducer([(4,)] * 3, [tf.float32] * 3, fusion_threshold_bytes=0)


@tf.function
def reduce_three(t):
    return allreducer([t * 1.0, t * 2.0, t * 3.0])


graph = reduce_three.get_concrete_function(tf.TensorSpec((4,), tf.float32)).graph
starts = [op for op in graph.get_operations() if op.type == "TntStartAllreduce"]
assert len(starts) == 3, starts
waits = [(op.name, c.name) for op in starts for c in op.control_inputs if c.type == "TntStartAllreduce"]
assert not waits, f"start ops wait for each other: {waits}"
sums = [r.numpy().tolist() for r in reduce_three(tf.ones(4))]
assert sums == [[float(k * tnt.get_size())] * 4 for k in (1, 2, 3)], sums
allreducer.close()
print("GRAPH OK", flush=True)
