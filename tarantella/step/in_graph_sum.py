"""An in-graph sum over the ranks (TntAllreduceSum), with its gradient, for small tensors that an op
needs before it can go on: BatchNormalization's global statistics (tarantella/step/global_batch_norm.py).

Every rank must run these ops in one order. tf.function runs the stateful ops of a step that touch no
resource one after another in creation order, and every rank creates the same ops in the same order (same
model, same step), so the ops meet: Note [In-graph allreduces] in csrc/engine/engine.hpp. (The
gradient ops of graph_allreduce.py leave that chain on purpose; these stay in it.) A sum waits on the
engine's worker thread, not on TensorFlow's, which runs the rest of the step meanwhile: a peer may need
some of that rest before it reaches the same sum (Note [An in-graph sum does not hold the framework's
thread] in csrc/engine/graph_allreducer.hpp).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella import runtime, tf_ops
from tarantella.timeline import graph_marks

__all__ = ["InGraphSum"]


class InGraphSum:
    """Created collectively (every rank, at the same point): an engine allreducer with its own communicator."""

    def __init__(self, group=None):
        """group: a tarantella.collectives.Group to sum over (default: the world)."""
        from tarantella import _engine
        self._ops = tf_ops.load_ops()
        self.id = _engine.add_graph_allreducer(runtime.world_group() if group is None else group._handle)

    def __call__(self, tensor: tf.Tensor) -> tf.Tensor:
        """The element-wise sum of `tensor` over the ranks; its gradient is the sum of the gradients. On the
        timeline: a `statistics_allreduce` span from the input existing to the sum existing."""
        tensor = graph_marks.mark(tensor, graph_marks.STATISTICS_SENT)
        return graph_marks.mark(self._ops.tnt_allreduce_sum(tensor, allreducer=self.id),
                                graph_marks.STATISTICS_SUMMED)


@tf.RegisterGradient("TntAllreduceSum")
def _sum_of_gradients(op, gradient):
    # Every rank's loss depends on the sum, and the sum on every rank's input with weight 1: the gradient
    # of the ranks' total loss with respect to this rank's input is the sum of their gradients.
    return tf_ops.load_ops().tnt_allreduce_sum(gradient, allreducer=op.get_attr("allreducer"))
