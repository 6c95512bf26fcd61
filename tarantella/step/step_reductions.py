"""The sums over the ranks that a data-parallel model's traced steps hold: one allreducer per purpose and tensor
list (the gradients, with the metric state riding at their end; the metrics of a test step; a model's own
logs), and one small in-graph sum for BatchNormalization's statistics. tnt.Model (tarantella/keras/model.py)
owns one of these; its train, test and predict steps (tf_steps.py, user_steps.py) ask it for their reducers
while they are traced, and the timeline and tnt-repro read them."""
from __future__ import annotations

import tensorflow as tf

from tarantella.step import gradient_reduction, metric_reduction
from tarantella.step.graph_allreduce import GraphAllreducer
from tarantella.step.in_graph_sum import InGraphSum
from tarantella.timeline import overlap

__all__ = ["StepReductions"]


class StepReductions:
    """overlap_communication: start each bucket's allreduce while backprop goes on (False: once it is done)."""

    def __init__(self, world_size: int, overlap_communication: bool):
        self.world_size = world_size
        self.overlap_communication = overlap_communication
        self.allreducers: list[tuple[str, GraphAllreducer]] = []   # (purpose, allreducer)
        self.gradient_allreducer: GraphAllreducer | None = None
        self.metric_state_count = 0   # metric tensors riding at the end of the gradient allreducer
        # Note [Metric state rides with the gradients]; False (tests, measurements): a separate reduction after them
        self.metrics_ride = True
        self._statistics_allreducer: InGraphSum | None = None

    @property
    def metrics_ride_with_gradients(self) -> bool:
        return self.world_size > 1 and self.metrics_ride

    def gradients_and_metrics(self, gradients, variables, metric_state=(), to_owners=None, gathering=None):
        """(sum of every rank's gradients, sum of every rank's `metric_state` tensors), in one reduction (Note
        [Metric state rides with the gradients] in metric_reduction.py); called while tracing a train step.
        to_owners: ZeRO stage 2's reduction of each gradient to its owner (sharding.reduction_to_owners), or None;
        gathering: shard="weights", whose gradients are summed on their owners in backprop (Note [Weights gathered
        layer by layer] in tarantella/sharding/gathered_weights.py), or None."""
        metric_state = list(metric_state)
        if self.world_size == 1:
            return gradients, metric_state

        def allreducer_for(tensors):
            self.gradient_allreducer = self.allreducer_for(tensors, "gradients")
            self.metric_state_count = len(metric_state)
            return self.gradient_allreducer

        if gathering is not None:
            return gathering.marked(gradients), self._metrics_alone(metric_state)
        riding = metric_reduction.RidingAllreducer(allreducer_for, metric_state)
        reduced = gradient_reduction.weighted_sum(gradients, variables, None, riding, self.overlap_communication,
                                                  to_owners)
        summed_state = riding.summed_state
        if summed_state is None:  # no dense gradient to ride with
            summed_state = self._metrics_alone(metric_state)
        return reduced, summed_state

    def _metrics_alone(self, metric_state: list):
        return self.allreducer_for(metric_state, "metrics")(metric_state) if metric_state else []

    def statistics(self, tensor: tf.Tensor) -> tf.Tensor:
        """The sum over the ranks of a small tensor a layer needs at once (BatchNormalization's statistics). Made
        collectively on first use (every rank traces the same layers in the same order)."""
        if self._statistics_allreducer is None:
            self._statistics_allreducer = InGraphSum()
        return self._statistics_allreducer(tensor)

    def allreducer_for(self, tensors, purpose: str) -> GraphAllreducer:
        """One reducer per purpose and tensor list, reused by every traced step (train, test, retraces).
        Created collectively: every rank traces the same steps in the same order."""
        for known_purpose, allreducer in self.allreducers:
            if known_purpose == purpose and allreducer.matches(tensors):
                return allreducer
        allreducer = GraphAllreducer([t.shape for t in tensors], [t.dtype for t in tensors])
        self.allreducers.append((purpose, allreducer))
        return allreducer

    def communication_profile(self) -> dict | None:
        """How the last train step's gradient allreduce overlapped backprop (tarantella.timeline.overlap); None
        before the first step or on one rank."""
        if self.gradient_allreducer is None:
            return None
        profile = overlap.communication_profile(self.gradient_allreducer.last_step_times())
        profile["bucket_bytes"] = self.gradient_allreducer.bucket_bytes()
        return profile

    def timeline_allreducers(self) -> list:
        """(purpose, allreducer) pairs for the timeline: the metric buckets riding in the gradient reducer count
        as the metrics' (Note [Metric state rides with the gradients])."""
        pairs = list(self.allreducers)
        if self.gradient_allreducer is not None and self.metric_state_count:
            pairs.append(("metrics", metric_reduction.MetricBuckets(self.gradient_allreducer,
                                                                    self.metric_state_count)))
        return pairs

    def close(self) -> None:
        """A new compile: the reducers of the steps traced so far are done."""
        for _, allreducer in self.allreducers:
            allreducer.close()
        self.allreducers = []
        self.gradient_allreducer = None
        self.metric_state_count = 0
