"""One rank's part of a pipeline step, as one traced TensorFlow graph: the
forward and backward passes of all micro-batches in schedule order, the
transfers of activations and their gradients to the other stages of the
replica, and the summed gradients (the caller adds the allreduce and the
update in the same tf.function; pipelined_model.py).

Note [Scaling the micro-batch loss]
The unpartitioned model's update is the gradient of the mean loss over the
global batch of N samples. The last stage of replica r computes, for its
micro-batch m of n_m samples, Keras's loss L_m (a mean over n_m samples) and
backpropagates L_m * n_m / N. Summing over the micro-batches (accumulated on
each stage) and over the replicas (an allreduce sum in the stage's group)
gives the gradient of sum_m L_m n_m / N, the global mean. The logged loss is
the global mean too: the loss metric is updated with L_m weighted by n_m and
metric states are summed over the replicas.

Note [The schedule inside one graph]
Within a tf.function, TensorFlow runs an op as soon as its inputs exist, so
the schedule's order has to be written into the graph as dependencies:
- pass i starts (its inputs are released through tf.identity) only once pass
  i-1 has produced its outputs: one pass at a time, in schedule order, which
  is what bounds 1F1B's live activations (TensorFlow frees a forward's
  activations once its backward has consumed them);
- the receives of pass i + lookahead are posted once pass i-1 is done, so an
  activation or a gradient travels (on the engine's progress thread) while
  this stage computes the passes before it, and at most `lookahead` passes'
  receive buffers exist ahead of time;
- a send is posted as soon as the tensor it sends exists, and the step ends
  only when every send has left (its token is part of the step's result).
The transfer ops are stateless (Note [Transfers are stateless async ops] in
csrc/tf/p2p_ops.cc) so that tf.function does not chain them in creation order.
Each pass is bracketed by clock reads: the per-pass compute times of the last
step (`StepTrace`), from which the benchmark measures the bubble.

Note [A pipeline's micro-batches and the layers that look at the batch]
Each forward pass runs the stage's layers on one micro-batch, inside the
position of its samples in the global batch (tarantella/step/batch_position.py):
- random layers draw, for each sample, the values serial Keras draws for it
  (Note [Random values by sample, not by rank]): every micro-batch's call starts
  from the step's SeedGenerator states (serial_random.StepSeedStates), and the
  step leaves them advanced once, as serial's;
- BatchNormalization normalises each micro-batch with the statistics of that
  micro-batch, as GPipe does (the layers after it cannot wait for the other
  micro-batches without serialising the pipeline), taken over the same
  micro-batch of every data-parallel replica of the stage (one allreduce in
  the stage's group, Note [BatchNormalization over the global batch]; with
  batch_norm="local" the replica's own); its moving statistics take one step
  per micro-batch. So a pipelined model with BatchNormalization trains with
  statistics of B/M samples where serial uses B: a difference of semantics,
  documented, which tnt-repro names as the cause when it makes a run differ.

Note [Pass times under op determinism]
TensorFlow refuses tf.timestamp once `enable_op_determinism` is on (what
tnt.set_deterministic and tnt-repro set), and a step containing it fails. So the
clock is chosen when the step is traced: tf.timestamp without determinism (an
op, nearly free); under determinism the host's clock through tf.py_function
(a Python call per pass boundary), only when something reads the times (the
timeline, or `record_pass_times` set by a benchmark or test); otherwise no
clock at all: each pass's start stays an ordering point (an identity under the
same control dependencies) and the trace has no times.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import keras
import numpy as np
import tensorflow as tf

from tensorflow.python.framework import config as tf_config

from tarantella import tf_ops, timeline
from tarantella.step import batch_position, serial_random
from tarantella.pipelining.partition import Partition
from tarantella.pipelining.schedules import BACKWARD, FORWARD, WEIGHT, Pass
from tarantella.pipelining.topology import Placement
from tarantella.pipelining.weight_gradients import DeferredDense, deferrable_layers

__all__ = ["StageStep", "StepTrace", "MicroBatchData", "LAYER_LOSSES_TAG", "LOGS_TAG"]

# Message tags of the per-step values beside the activations (pipelined_model.py); the micro-batches'
# tags follow them.
LAYER_LOSSES_TAG = 0   # an earlier stage's layer losses, to the last stage
LOGS_TAG = 1           # the step's logs, from the last stage to the others
CONTROL_TAGS = 2


class StepTrace:
    """When this rank computed during the last step (seconds since the epoch, as time.time())."""

    def __init__(self, passes: list[Pass] | None = None, times=None, start: float = 0.0, end: float = 0.0):
        self.start, self.end = start, end
        self.schedule = passes or []   # the passes in schedule order
        self._times = times          # a [passes, 2] tensor, read only when asked for

    @property
    def passes(self) -> list[tuple[str, int, float, float]]:
        """(kind, micro-batch, compute start, compute end) per pass, in schedule order."""
        if self._times is None:
            return []
        times = np.asarray(self._times)
        return [(p.kind, p.micro_batch, float(a), float(b)) for p, (a, b) in zip(self.schedule, times)]

    @property
    def busy(self) -> float:
        return sum(end - start for _, _, start, end in self.passes)


@dataclasses.dataclass
class MicroBatchData:
    """What the traced schedule reads from the global batch (None where this stage needs none)."""
    inputs: list | None        # first stage: the flat model inputs of this replica's part
    targets: object = None     # last stage: y of this replica's part
    sample_weight: object = None
    sizes: tuple = ()          # samples per micro-batch (static)
    first: int = 0             # the replica part's first sample in the global batch
    global_size: int = 0

    def cut(self, tree, m: int):
        if tree is None:
            return None
        start = sum(self.sizes[:m])
        return keras.tree.map_structure(lambda t: t[start:start + self.sizes[m]], tree)


class _Forward:
    """What a forward pass leaves for its backward pass."""

    def __init__(self, tape, received, outputs, loss, penalty):
        self.tape, self.received, self.outputs, self.loss = tape, received, outputs, loss
        self.penalty = penalty      # earlier stages: the scaled share of their layers' losses (or None)


class StageStep:
    """Builds the graph of one stage's schedule (call `build` while tracing)."""

    def __init__(self, partition: Partition, placement: Placement, channels, lookahead: int = 2):
        self.partition = partition
        self.placement = placement
        self.channels_id = channels.id if channels is not None else 0
        self.lookahead = lookahead
        self.stage = placement.stage
        self.plan = partition.stages[self.stage]
        self.model = self.plan.model
        self.edges_in = partition.edges_into(self.stage)
        self.edges_out = partition.edges_out_of(self.stage)
        self._ops = tf_ops.load_ops() if channels is not None else None
        self.trace = StepTrace()
        self.record_pass_times = False   # under op determinism: read the host clock per pass anyway
        self.last_upstream_sends = []    # set by build()
        # Layers that look at the batch (Note [A pipeline's micro-batches and the layers that look at the
        # batch]): the model's batch_norm choice and the sum over this stage's replicas (None: one replica).
        self.batch_norm = batch_position.GLOBAL_BATCH_NORM
        self.statistics_allreduce = None

    @property
    def defers_weight_gradients(self) -> bool:
        """Whether this stage has layers whose weight gradients wait for weight passes (Note [Deferred
        weight gradients] in weight_gradients.py); the training schedule then needs WEIGHT passes."""
        return bool(deferrable_layers(self.model))

    def record(self, passes: list[Pass], times, start: float, end: float) -> None:
        self.trace = StepTrace(passes, times, start, end)

    # --- transfers ----------------------------------------------------------------

    def _tag(self, micro_batch: int, edge: int, backward: bool) -> int:
        return CONTROL_TAGS + (micro_batch * len(self.partition.edges) + edge) * 2 + int(backward)

    def send_control(self, tensor, stage: int, tag: int):
        """Traced: send a per-step value (not an activation) to `stage` of this replica; a token."""
        return self._send(tensor, stage, tag)

    def receive_control(self, after, shape, dtype, stage: int, tag: int):
        """Traced: receive a per-step value of `shape` from `stage`, posted once `after` exists."""
        return self._ops.tnt_receive(after, T=tf.as_dtype(dtype), shape=tuple(shape), channels=self.channels_id,
                                     peer=self.placement.peer(stage), tag=tag)

    def _send(self, tensor, stage: int, tag: int):
        return self._ops.tnt_send(tensor, channels=self.channels_id, peer=self.placement.peer(stage), tag=tag)

    def _receive(self, after, edge, n: int, stage: int, tag: int):
        return self._ops.tnt_receive(after, T=tf.as_dtype(edge.dtype), shape=(n,) + tuple(edge.shape),
                                     channels=self.channels_id, peer=self.placement.peer(stage), tag=tag)

    def _post_receives(self, p: Pass, n: int, after) -> dict:
        if p.kind == WEIGHT:
            return {}
        if p.kind == FORWARD:
            return {e.id: self._receive(after, e, n, e.source, self._tag(p.micro_batch, e.id, False))
                    for e in self.edges_in}
        return {e.id: self._receive(after, e, n, e.target, self._tag(p.micro_batch, e.id, True))
                for e in self.edges_out if e.differentiable}

    # --- the schedule -----------------------------------------------------------------

    def build(self, passes: list[Pass], data: MicroBatchData, start, last_stage_loss, training: bool,
              scale_penalty=None, updates=None):
        """Traced: the ops of `passes` (Note [The schedule inside one graph]). `start` is an int32
        scalar argument of the tf.function (a receive must not depend on constants only, or graph
        optimisation could run it). last_stage_loss(m, y_pred_flat, y_m, sample_weight_m, n_m):
        the last stage's scaled loss of micro-batch m (None when not training).
        scale_penalty(m, value): an earlier stage's scaled share of its layers' losses (add_loss,
        regularizers) in micro-batch m; the last stage's are part of its loss (Keras's compute_loss).
        updates: an UpdatesInWeightPass whose layer updates the last weight pass applies (Note [Updates in
        the weight pass] in updates_in_weight_pass.py), or None.

        Returns (predictions {m: flat y_pred} on the last stage, summed gradients (None where a
        variable got none), send tokens, pass times [passes, 2], the earlier stage's layer losses
        summed over the micro-batches weighted by their sizes (a float32 scalar; 0 on the last stage)).
        `self.last_upstream_sends`: the tokens of the last backward pass's sends to the stage before
        (empty on the first stage; Note [When the update starts] in pipelined_model.py)."""
        self._penalties = []
        self._seeds = serial_random.StepSeedStates(self.model)
        variables = self.model.trainable_variables
        gradients = [None] * len(variables)
        deferred = any(p.kind == WEIGHT for p in passes)
        last_weight_pass = max((i for i, p in enumerate(passes) if p.kind == WEIGHT), default=None)
        self._deferred = DeferredDense(self.model, variables) if deferred else None
        received, live, predictions, tokens, times = {}, {}, {}, [], []
        clock = self._pass_clock()
        previous = []          # the outputs of the pass before
        posted = 0
        self.last_upstream_sends = []
        for index, p in enumerate(passes):
            after = start
            if previous:
                with tf.control_dependencies(previous):
                    after = tf.identity(start)
            while posted < min(len(passes), index + 1 + self.lookahead):
                q = passes[posted]
                received[posted] = self._post_receives(q, data.sizes[q.micro_batch], after)
                posted += 1
            arrived = received.pop(index)
            with tf.control_dependencies(previous + list(arrived.values())):
                began = clock()
            with tf.control_dependencies([began]):
                arrived = {e: tf.identity(t) for e, t in arrived.items()}
            m = p.micro_batch
            if p.kind == FORWARD:
                live[m], sends, y_pred, done = self._forward(m, arrived, data, began, last_stage_loss, training,
                                                             scale_penalty)
                if y_pred is not None:
                    predictions[m] = y_pred
            elif p.kind == BACKWARD:
                sends, done = self._backward(m, live.pop(m), arrived, began, variables, gradients)
                self.last_upstream_sends = sends
            else:
                update = None
                if updates is not None and index == last_weight_pass:
                    # Note [When the update starts] in pipelined_model.py: after the last sends upstream.
                    sends_before = list(self.last_upstream_sends)
                    update = lambda grads, variables: updates.update(grads, variables, sends_before)  # noqa: E731
                with tf.control_dependencies([began]):
                    sends, done = [], self._deferred.weight_pass(gradients, update) or [tf.constant(0)]
            tokens.extend(sends)
            with tf.control_dependencies(done):
                times.append(tf.stack([began, clock()]))
            previous = done
        penalty = tf.add_n(self._penalties) if self._penalties else tf.constant(0.0)
        timed = times and clock is not self._no_clock
        return (predictions, gradients, tokens, tf.stack(times) if timed else tf.zeros((0, 2), tf.float64),
                penalty)

    def _pass_clock(self):
        """Note [Pass times under op determinism]."""
        if not tf_config.is_op_determinism_enabled():
            return tf.timestamp
        if self.record_pass_times or timeline.enabled():
            return lambda: tf.py_function(time.time, [], tf.float64)
        return self._no_clock

    @staticmethod
    def _no_clock():
        return tf.identity(tf.zeros((), tf.float64))

    def _forward(self, m, arrived, data, began, last_stage_loss, training, scale_penalty):
        if self.placement.is_first_stage:
            with tf.control_dependencies([began]):
                inputs = [tf.identity(t) for t in data.cut(data.inputs, m)]
        else:
            inputs = [arrived[e] for e in self.plan.input_edges]
        tape = tf.GradientTape() if training else None
        if tape is not None:
            tape.__enter__()
            tape.watch([t for e, t in arrived.items() if self.partition.edges[e].differentiable])
        try:
            self._seeds.restore()
            with self._deferred.recording() if tape is not None and self._deferred else contextlib.nullcontext(), \
                    batch_position.tracing_step(self._position(m, data)):
                outputs = [tf.convert_to_tensor(o) for o in keras.tree.flatten(self.model(inputs, training=training))]
            loss, y_pred, penalty = None, None, None
            if not self.placement.is_last_stage and self.model.losses:
                value = tf.add_n([tf.cast(l, tf.float32) for l in self.model.losses])
                self._penalties.append(value * data.sizes[m])
                penalty = scale_penalty(m, value) if training else None
            if self.placement.is_last_stage:
                y_pred = [outputs[i] if kind == "computed" else arrived[i] for kind, i in self.plan.model_outputs]
                loss = last_stage_loss(m, y_pred, data.cut(data.targets, m), data.cut(data.sample_weight, m),
                                       data.sizes[m])
        finally:
            if tape is not None:
                tape.__exit__(None, None, None)
        sends = []
        for output, edges in zip(outputs, self.plan.output_edges):
            for e in edges:
                sends.append(self._send(output, self.partition.edges[e].target, self._tag(m, e, False)))
        done = outputs + [t for t in (loss, penalty) if t is not None]
        return (_Forward(tape, arrived, outputs, loss, penalty) if training else None), sends, y_pred, done

    def _position(self, m: int, data: MicroBatchData) -> batch_position.BatchPosition:
        """Where micro-batch m sits in the global batch (Note [A pipeline's micro-batches and the layers that
        look at the batch])."""
        return batch_position.of_rows(data.first + sum(data.sizes[:m]), data.sizes[m], data.global_size,
                                      world_size=self.placement.num_replicas, rank=self.placement.replica,
                                      batch_norm=self.batch_norm, statistics_allreduce=self.statistics_allreduce)

    def _backward(self, m, state: _Forward, arrived, began, variables, gradients):
        if self.placement.is_last_stage:
            with tf.control_dependencies([began]):
                seed = tf.ones_like(state.loss)
            targets, output_gradients = [state.loss], [seed]
        else:
            targets, output_gradients = [], []
            for output, edges in zip(state.outputs, self.plan.output_edges):
                grads = [arrived[e] for e in edges if e in arrived]
                if grads:
                    targets.append(output)
                    output_gradients.append(tf.add_n(grads) if len(grads) > 1 else grads[0])
            if state.penalty is not None:
                with tf.control_dependencies([began]):
                    targets.append(state.penalty)
                    output_gradients.append(tf.ones_like(state.penalty))
        sources = [e for e in state.received if self.partition.edges[e].differentiable]
        mark = self._deferred.mark() if self._deferred else None
        results = state.tape.gradient(targets, [state.received[e] for e in sources] + list(variables),
                                      output_gradients=output_gradients,
                                      unconnected_gradients=tf.UnconnectedGradients.NONE)
        sends, done = [], []
        for e, grad in zip(sources, results[:len(sources)]):
            grad = tf.zeros_like(state.received[e]) if grad is None else tf.convert_to_tensor(grad)
            sends.append(self._send(grad, self.partition.edges[e].source, self._tag(m, e, True)))
            done.append(grad)
        for i, grad in enumerate(results[len(sources):]):
            if grad is not None:
                grad = tf.convert_to_tensor(grad)
                gradients[i] = grad if gradients[i] is None else gradients[i] + grad
                done.append(gradients[i])
        if mark is not None:
            done += self._deferred.recorded_since(mark)
        return sends, done or [tf.constant(0)]
