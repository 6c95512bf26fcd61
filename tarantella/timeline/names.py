"""The names of the timeline's tracks and spans: one home, documented here.

Note [Timeline span names]
Each rank is one process of the trace ("rank R"); its tracks (threads):
  step       python: `train_step` per fit step (args: step) = the call of the
             compiled step from Keras's loop; `backward` per step, from the
             first gradient op (the scaled loss exists; with a model's own
             train_step: the first gradient produced) to the last gradient
             produced (args: step, gradients); `optimizer_update` from the first
             reduced gradient delivered to the end of the optimizer's apply
             (args: step); with shard="optimizer" also `weight_handoff`, from
             this rank's own updates written to the last updated weight sent
             or received (Note [Handing the updated weights over]; args: step,
             transfers); with shard="gradients" also `gradients_to_owners`,
             from the first gradient sent to its owner or received by this
             one to the last (Note [Gradients summed on their owners]; args:
             step, transfers), and no reducer spans.
  reducer    the gradient reducer's progress thread: per bucket an instant
             `bucket_ready` when its last gradient was handed over, and a span
             `allreduce` (args: step, bucket, bytes; metrics_only: true for a
             bucket that holds only metric state riding with the gradients)
             while it is reduced.
  metrics    the metric-state reduction: span `metric_allreduce` per bucket
             (args: step, bucket, bytes).
  statistics the in-graph allreduces of BatchNormalization's global statistics
             (Note [BatchNormalization over the global batch]): span
             `statistics_allreduce` per allreduce, from its input existing to its
             sum existing, so it includes the wait for the other ranks (args:
             step, index: its place in the step, forward ones first).
  pipeline   pipeline passes and transfers (tarantella.timeline.span callers).
  elastic    an elastic job's (tarantella --elastic) `elastic_commit` after a step
             or an epoch (args: step, written: whether this rank wrote its host's
             copy) and `elastic_restore` when a new generation starts from a
             commit (args: step, world_size: the ranks that made it); then
             `elastic_resize`, from that commit taken to the new generation
             holding it (steps trained after it, the lost rank's detection, the
             relaunch; args: step, world_size_before, world_size, generation).
             An elastic job's trace holds every generation (Note [Timeline
             files] in session.py).
  python     any other tarantella.timeline.span(name, ...) of the program.
A program computes the overlap from these names alone
(tarantella.timeline.overlap.overlap_from_trace).
"""
from __future__ import annotations

__all__ = ["TRACKS", "DOCUMENTED", "track_id", "STEP", "BACKWARD", "OPTIMIZER", "ALLREDUCE", "BUCKET_READY",
           "METRIC_ALLREDUCE", "STATISTICS_ALLREDUCE", "WEIGHT_HANDOFF", "GRADIENTS_TO_OWNERS",
           "WEIGHT_GATHERS", "ELASTIC_COMMIT", "ELASTIC_RESTORE", "ELASTIC_RESIZE"]

TRACKS = ("step", "reducer", "metrics", "pipeline", "python", "statistics", "elastic")

STEP = "train_step"
BACKWARD = "backward"
OPTIMIZER = "optimizer_update"
ALLREDUCE = "allreduce"
BUCKET_READY = "bucket_ready"
METRIC_ALLREDUCE = "metric_allreduce"
STATISTICS_ALLREDUCE = "statistics_allreduce"
WEIGHT_HANDOFF = "weight_handoff"
GRADIENTS_TO_OWNERS = "gradients_to_owners"
WEIGHT_GATHERS = "weight_gathers"
ELASTIC_COMMIT = "elastic_commit"
ELASTIC_RESTORE = "elastic_restore"
ELASTIC_RESIZE = "elastic_resize"

DOCUMENTED = {
    STEP: "step track: one fit step (args: step)",
    BACKWARD: "step track: first gradient op to last gradient produced (args: step, gradients)",
    OPTIMIZER: "step track: first reduced gradient delivered to the end of the optimizer update (args: step)",
    BUCKET_READY: "reducer track, instant: a bucket's last gradient was handed to the reducer (args: step, bucket)",
    ALLREDUCE: "reducer track: a gradient bucket's allreduce (args: step, bucket, bytes; metrics_only if it "
               "holds only metric state)",
    METRIC_ALLREDUCE: "metrics track: a metric-state bucket's allreduce (args: step, bucket, bytes)",
    WEIGHT_HANDOFF: "step track, shard='optimizer': own updates written to the last updated weight sent or "
                    "received (args: step, transfers)",
    GRADIENTS_TO_OWNERS: "step track, shard='gradients': the first gradient sent to its owner or received by this "
                         "one to the last; its overlap with `backward` is the overlap (args: step, transfers)",
    WEIGHT_GATHERS: "step track, shard='weights': the first layer weight sent or received for a forward or "
                    "backward pass to the last (args: step, transfers)",
    STATISTICS_ALLREDUCE: "statistics track: an in-graph allreduce of BatchNormalization's statistics, input to "
                          "sum (args: step, index)",
    ELASTIC_COMMIT: "elastic track: a commit after a step or an epoch (args: step, written)",
    ELASTIC_RESTORE: "elastic track: a new generation's restore of the newest commit (args: step, world_size)",
    ELASTIC_RESIZE: "elastic track: from the commit a new generation restored being taken to the generation "
                    "holding it (args: step, world_size_before, world_size, generation)",
}


def track_id(track: str) -> int:
    """Stable thread id of a track (known tracks first, in TRACKS order)."""
    if track in TRACKS:
        return TRACKS.index(track) + 1
    return len(TRACKS) + 1 + (sum(map(ord, track)) % 1000)
