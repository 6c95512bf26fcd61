"""Keep the engine's point-to-point sends inside a compiled step (shard="optimizer" and "gradients").

Note [Sends are kept by a counter]
The engine's TntSend/TntReceive ops are not stateful ops (the pipeline's
schedule relies on that: stateful ops would be chained under tf.function's
automatic control dependencies), so a send whose token nobody reads is turned
into a no-op by TensorFlow's graph optimiser, and its peer's receive waits
for it until the timeout. Every send's token is therefore added into a counter
variable, whose update must run. The counter also gives a receive the tensor
it is posted after: a read of the counter under control dependencies, which
the graph optimiser cannot fold away as it can a constant.
"""
from __future__ import annotations

import tensorflow as tf

__all__ = ["SendCounter"]


class SendCounter:
    def __init__(self, name: str):
        self.variable = tf.Variable(0, dtype=tf.int64, trainable=False, name=name)

    def after(self, tensors: list) -> tf.Tensor:
        """An int32 scalar that exists once `tensors` do: the input of a receive to be posted then."""
        with tf.control_dependencies(tensors):
            return tf.cast(self.variable.read_value(), tf.int32)

    def count(self, tokens: list) -> None:
        """Traced: every send of `tokens` must run (Note above)."""
        if tokens:
            self.variable.assign_add(tf.cast(tf.add_n([token + 1 for token in tokens]), tf.int64))
