"""Sum a fixed list of tensors over all ranks from inside a compiled (tf.function)
step, through the engine's fused reducer and the op library (csrc/tf).

The tensors are registered once, in the order they are expected to become
ready (for gradients: the order backprop produces them, the reverse of
`trainable_variables`): the progress thread reduces buckets in registration
order until it has seen the order of a real step, then in that order (Note
[Buckets are reduced in an agreed order] in csrc/engine/fused_reducer.hpp).
Per step, each tensor gets a start op that depends on that tensor alone, so
its bucket's allreduce can begin while backprop continues, and a finish op
that yields the sum (Note [Start and finish are separate ops] in
csrc/tf/allreduce_ops.cc).

Note [Start and finish ops are not chained]
Both ops are stateful (TensorFlow must neither prune, constant-fold nor merge
a collective), and tf.function's automatic control dependencies run the
stateful ops of a function that touch no resource one after another in
creation order: every start would wait for the previous one, so one gradient
produced late held back every later bucket, and every finish (and with it the
optimizer's update of every variable) waited for the last start. The ops'
only side effect is the hand-over to the reducer, whose result reaches
nothing but their own finish op, by data. So each op is handed to the
function's automatic-control-dependency manager as an independent op
(`run_independently`, the mechanism TensorFlow uses for its order-insensitive
stateful ops, MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS): it stays stateful and
must run before the function returns, but is ordered by its data alone. A
start then runs the moment its tensor exists, in whatever order backprop
produces them, and a finish as soon as its bucket is reduced, so the update of
an early bucket's variables proceeds while later buckets travel. Ranks may
now hand tensors over in different orders: buckets have static ids and are
reduced in one agreed order (Note [Buckets are reduced in an agreed order]), and
each reducer has its own progress thread and communicator, so nothing
deadlocks. The no-overlap mode adds explicit control edges from every tensor
to every start (a barrier the graph optimiser keeps; an IdentityN barrier,
used before, is removed by Grappler's dependency optimiser).
"""
from __future__ import annotations

import contextlib
import functools
import logging

import tensorflow as tf

from tarantella import runtime, tf_ops

__all__ = ["GraphAllreducer", "unchained"]

logger = logging.getLogger("tarantella")


class GraphAllreducer:
    """Created collectively (every rank, same tensors in the same order)."""

    def __init__(self, shapes: list[tf.TensorShape], dtypes: list[tf.DType], fusion_threshold_bytes: int | None = None,
                 group=None):
        """group: a tarantella.collectives.Group to sum over (default: the world)."""
        from tarantella import _engine
        settings = runtime.settings()
        threshold = settings.fusion_threshold_bytes if fusion_threshold_bytes is None else fusion_threshold_bytes
        self.shapes = [tf.TensorShape(shape) for shape in shapes]
        self.dtypes = [tf.as_dtype(dtype) for dtype in dtypes]
        for shape in self.shapes:
            if not shape.is_fully_defined():
                raise ValueError(f"tarantella: cannot allreduce a tensor of unknown shape {shape}")
        self._ops = tf_ops.load_ops()
        specs = [(shape.num_elements(), dtype.name) for shape, dtype in zip(self.shapes, self.dtypes)]
        self._reducer = _engine.Reducer(specs, threshold, "sum", settings.allreduce_algorithm,
                                        runtime.world_group() if group is None else group._handle)

    @property
    def bucket_count(self) -> int:
        return self._reducer.bucket_count

    def bucket_of(self, tensor: int) -> int:
        """The bucket that holds tensor `tensor` (its index in the registration order)."""
        return self._reducer.bucket_of(tensor)

    def bucket_bytes(self) -> list[int]:
        return [self._reducer.bucket_bytes(b) for b in range(self._reducer.bucket_count)]

    def reductions_completed(self) -> int | None:
        """Bucket allreduces this reducer finished so far (the engine's counter, for tnt-repro's
        Note [Refusing runs that distributed nothing]); None when the engine has no counter or the
        reducer is closed."""
        try:
            return int(self._reducer.reductions_completed)
        except (AttributeError, RuntimeError, ValueError):
            return None

    def last_step_times(self) -> list[tuple[float, float, float]]:
        """(queued, started, finished) per bucket in the last step, seconds on the reducer's clock."""
        return self._reducer.last_step_times()

    def clock_origin(self) -> float:
        """time.monotonic() seconds that last_step_times count from (for tarantella.timeline)."""
        return self._reducer.clock_origin

    def matches(self, tensors) -> bool:
        return (len(tensors) == len(self.shapes)
                and all(t.shape == s and t.dtype == d for t, s, d in zip(tensors, self.shapes, self.dtypes)))

    def __call__(self, tensors: list[tf.Tensor], overlap: bool = True, last: int = 0) -> list[tf.Tensor]:
        """The element-wise sums over all ranks, in the registration order. Builds graph ops:
        call it while tracing. overlap=False starts no allreduce before every tensor exists.
        last: the last `last` tensors are handed over only once every other tensor exists (Note [Metric
        state rides with the gradients] in metric_reduction.py)."""
        if not self.matches(tensors):
            raise ValueError("tarantella: the tensors to reduce differ from the ones registered: "
                             f"{[(t.shape, t.dtype.name) for t in tensors]} vs "
                             f"{[(s, d.name) for s, d in zip(self.shapes, self.dtypes)]}")
        reducer = self._reducer.id
        first = len(tensors) - last if last else len(tensors)

        def start(index, tensor):
            return unchained(self._ops.tnt_start_allreduce(tensor, reducer=reducer, tensor=index))

        # Note [Start and finish ops are not chained]
        with contextlib.nullcontext() if overlap else tf.control_dependencies(tensors):
            tokens = [start(index, tensor) for index, tensor in enumerate(tensors[:first])]
        with tf.control_dependencies(tensors[:first]):
            tokens += [start(first + index, tensor) for index, tensor in enumerate(tensors[first:])]
        return [unchained(self._ops.tnt_finish_allreduce(token, T=dtype, shape=shape, reducer=reducer, tensor=index))
                for index, (token, dtype, shape) in enumerate(zip(tokens, self.dtypes, self.shapes))]

    def close(self) -> None:
        self._reducer.close()


def unchained(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor`, whose op (stateful) is ordered by its data alone, not behind the function's other
    stateful ops (Note [Start and finish ops are not chained]). Eager: nothing to do."""
    if tf.executing_eagerly():
        return tensor
    op = tensor.op
    manager = getattr(op.graph, "experimental_acd_manager", None)
    if manager is not None:
        manager.run_independently(op)
    elif getattr(op.graph, "_add_control_dependencies", False):  # pragma: no cover - another TensorFlow
        _warn_chained()
    return tensor


@functools.lru_cache(maxsize=None)
def _warn_chained() -> None:
    logger.warning("tarantella: this TensorFlow has no automatic-control-dependency manager on its graphs; "
                   "allreduce start ops run in creation order (correct, less overlap)")
