"""Sum a fixed list of tensors over all ranks from inside a compiled (tf.function)
step, through the engine's fused reducer and the op library (csrc/tf).

The tensors are registered once, in the order they are expected to become
ready (for gradients: the order backprop produces them, the reverse of
`trainable_variables`), since the progress thread reduces buckets in
registration order (Note [Buckets are reduced in id order] in
csrc/engine/fused_reducer.hpp). Per step, each tensor gets a start op that
depends on that tensor alone, so its bucket's allreduce can begin while
backprop continues, and a finish op that yields the sum
(Note [Start and finish are separate ops] in csrc/tf/allreduce_ops.cc).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella import runtime, tf_ops

__all__ = ["GraphAllreducer"]


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

    def __call__(self, tensors: list[tf.Tensor], overlap: bool = True) -> list[tf.Tensor]:
        """The element-wise sums over all ranks, in the registration order. Builds graph ops:
        call it while tracing. overlap=False starts no allreduce before every tensor exists."""
        if not self.matches(tensors):
            raise ValueError("tarantella: the tensors to reduce differ from the ones registered: "
                             f"{[(t.shape, t.dtype.name) for t in tensors]} vs "
                             f"{[(s, d.name) for s, d in zip(self.shapes, self.dtypes)]}")
        if not overlap:
            tensors = tf.identity_n(tensors)
        reducer = self._reducer.id
        # All start ops before any finish op: tf.function runs stateful ops in creation order.
        tokens = [self._ops.tnt_start_allreduce(tensor, reducer=reducer, tensor=index)
                  for index, tensor in enumerate(tensors)]
        return [self._ops.tnt_finish_allreduce(token, T=dtype, shape=shape, reducer=reducer, tensor=index)
                for index, (token, dtype, shape) in enumerate(zip(tokens, self.dtypes, self.shapes))]

    def close(self) -> None:
        self._reducer.close()
