"""A pipeline step's logs, the same on every rank.

Note [The logs travel in the step]
Keras hands every rank's callbacks the step's logs, and they must be the same
on every rank (an EarlyStopping on each rank must stop all together). The
last stage computes them in the step's graph from the metric states (summed
over the replicas in its stage's group) and sends them, as a vector of
LOG_SLOTS float64 values behind their count, to the other stages of its
replica, which receive them in their own step; the values arrive after the
last stage's last forward pass, well before the earlier stages end. Python
then only names the values: the names are broadcast once per mode after
compile (the first step). Logs the vector cannot carry (more than LOG_SLOTS
values, or not scalars) are sent with a count of -1, and then every rank
takes the Python broadcast of the last stage's logs (`broadcast_logs`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.step.graph_allreduce import GraphAllreducer
from tarantella.step.metric_reduction import graph_global_results, metric_variables, results_from_state
from tarantella.pipelining.compiled_step import LOGS_TAG, StageStep
from tarantella.pipelining.topology import Placement

__all__ = ["StepLogs", "LOG_SLOTS"]

LOG_SLOTS = 32   # scalar logs carried in the step


class StepLogs:
    """The logs of this rank's steps: traced into the step (`in_graph`), named and published after it."""

    def __init__(self, placement: Placement, runner: StageStep, stage_group):
        self.placement = placement
        self.runner = runner
        self.stage_group = stage_group
        self.latest = None                          # the last step's logs (get_metrics_result)
        self._keys, self._traced_keys = {}, {}      # per mode: the logs' names
        self._metric_allreducers = {}

    def forget_names(self) -> None:
        """After compile: the metrics, and so the logs' names, may have changed."""
        self._keys, self._traced_keys = {}, {}

    def in_graph(self, mode: str, start, metrics):
        """Traced: the step's logs as a float64 vector on every stage of the replica, and the tokens of the
        last stage's sends."""
        last = self.placement.num_stages - 1
        if not self.placement.is_last_stage:
            return self.runner.receive_control(start, (LOG_SLOTS + 1,), tf.float64, last, LOGS_TAG), []
        results = graph_global_results(metrics, self._metric_allreducer)
        keys = list(results)
        values = [tf.convert_to_tensor(results[k]) for k in keys]
        if len(keys) <= LOG_SLOTS and all(v.shape.rank == 0 and (v.dtype.is_floating or v.dtype.is_integer)
                                          for v in values):
            self._traced_keys[mode] = keys
            carried = tf.stack([tf.cast(v, tf.float64) for v in values]) if values else tf.zeros([0], tf.float64)
            vector = tf.concat([tf.constant([len(keys)], tf.float64), carried,
                                tf.zeros([LOG_SLOTS - len(keys)], tf.float64)], 0)
        else:
            self._traced_keys[mode] = None
            vector = tf.concat([[-1.0], tf.zeros([LOG_SLOTS], tf.float64)], 0)
        vector = vector + tf.cast(start, tf.float64) * 0.0   # not a constant: graph optimisation must not fold it
        sends = [self.runner.send_control(vector, s, LOGS_TAG) for s in range(last)]
        return vector, sends

    def _metric_allreducer(self, tensors):
        """The sum of the last stages' metric states over the replicas (in the stage's group)."""
        if self.placement.num_replicas == 1:
            return lambda values: values
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if key not in self._metric_allreducers:
            self._metric_allreducers[key] = GraphAllreducer([t.shape for t in tensors], [t.dtype for t in tensors],
                                                            group=self.stage_group)
        return self._metric_allreducers[key]

    def publish(self, vector, mode: str, metrics) -> dict:
        """The step's logs from its vector; collective the first time after compile per mode (the logs'
        names), and whenever the logs do not fit the vector."""
        vector = np.asarray(vector)
        root = self.placement.rank_of(0, self.placement.num_stages - 1)
        if mode not in self._keys:
            keys = self._traced_keys.get(mode) if self.placement.is_last_stage else None
            if runtime.get_size() > 1:
                keys = collectives.broadcast_object(keys, root=root)
            self._keys[mode] = keys
        keys = self._keys[mode]
        if vector[0] >= 0 and keys is not None:
            logs = {k: float(v) for k, v in zip(keys, vector[1:1 + int(vector[0])])}
        else:
            logs = self._broadcast(metrics, root)
        self.latest = logs
        return dict(logs)

    def _broadcast(self, metrics, root: int) -> dict:
        """Collective: the last stage's logs, as Python objects (logs the vector cannot carry)."""
        logs = None
        if self.placement.is_last_stage:
            values = [np.asarray(v.numpy()) for v in metric_variables(metrics)]
            if self.placement.num_replicas > 1:
                values = [collectives.allreduce(v, group=self.stage_group) if v.size else v for v in values]
            results = results_from_state(metrics, [tf.convert_to_tensor(v) for v in values])
            logs = {k: float(v) if np.ndim(v) == 0 else np.asarray(v) for k, v in results.items()}
        if runtime.get_size() > 1:
            logs = collectives.broadcast_object(logs, root=root)
        return logs
