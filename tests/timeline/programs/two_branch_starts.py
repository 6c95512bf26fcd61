"""A two-branch model whose backprop order differs from its variable order, trained with the timeline on:
the shallow branch (created first, so registered LAST) has its gradient long before the deep branch's first
layer. Also checks, in a traced graph, that no start or finish op waits for another one."""
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
        self.deep = [keras.layers.Dense(2048, activation="relu", name=f"deep{i}") for i in range(4)]
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

# The traced graph (Note [Start and finish ops are not chained]): no start or finish op waits for another
# allreduce op, all of them still must run (the function's control outputs), and the sums are right. In the
# no-overlap mode every start waits for every tensor.
from tarantella.step.graph_allreduce import GraphAllreducer  # noqa: E402

allreducer = GraphAllreducer([(4,)] * 3, [tf.float32] * 3, fusion_threshold_bytes=0)
ALLREDUCE_OPS = ("TntStartAllreduce", "TntFinishAllreduce")


def traced(overlap):
    @tf.function
    def reduce_three(t):
        return allreducer([t * 1.0, t * 2.0, t * 3.0], overlap=overlap)

    return reduce_three, reduce_three.get_concrete_function(tf.TensorSpec((4,), tf.float32)).graph


for overlap in (True, False):
    reduce_three, graph = traced(overlap)
    ours = [op for op in graph.get_operations() if op.type in ALLREDUCE_OPS]
    assert sorted(op.type for op in ours) == sorted(ALLREDUCE_OPS * 3), ours
    waits = [(op.name, c.name) for op in ours for c in op.control_inputs if c.type in ALLREDUCE_OPS]
    assert not waits, f"allreduce ops wait for each other: {waits}"
    must_run = set(graph.control_outputs)
    assert all(op in must_run for op in ours), f"not all allreduce ops must run: {must_run}"
    products = {op.name for op in graph.get_operations() if op.type == "Mul"}
    for start in (op for op in ours if op.type == "TntStartAllreduce"):
        waited_for = {c.name for c in start.control_inputs} & products  # its own input is a data edge
        assert waited_for == (set() if overlap else products - {start.inputs[0].op.name}), (overlap, start.name, waited_for)
    sums = [r.numpy().tolist() for r in reduce_three(tf.ones(4))]
    assert sums == [[float(k * tnt.get_size())] * 4 for k in (1, 2, 3)], sums
allreducer.close()
print("GRAPH OK", flush=True)
