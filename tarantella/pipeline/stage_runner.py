"""One rank's part of a pipeline step: run its stage's passes in schedule
order, exchanging activations and their gradients with the other stages of
its replica through the peer channels.

Note [Scaling the micro-batch loss]
The unpartitioned model's update is the gradient of the mean loss over the
global batch of N samples. The last stage of replica r computes, for its
micro-batch m of n_m samples, Keras's loss L_m (a mean over n_m samples) and
backpropagates L_m * n_m / N. Summing over the micro-batches (accumulated on
each stage) and over the replicas (an allreduce sum in the stage's group)
gives the gradient of sum_m L_m n_m / N, the global mean. The logged loss is
the global mean too: the loss metric is updated with L_m weighted by n_m and
metric states are summed over the replicas.

Note [Overlapping transfers with compute]
Sends are posted as soon as a pass's outputs exist and are waited for only at
the end of the step; receives are posted `lookahead` passes ahead, so an
activation or gradient travels on the engine's progress thread while this
stage computes. A pass waits only for its own inputs.
"""
from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from tarantella.pipeline.partition import Partition
from tarantella.pipeline.schedules import BACKWARD, FORWARD, Pass
from tarantella.pipeline.topology import Placement

__all__ = ["StageRunner", "StepTrace"]


class StepTrace:
    """When this rank computed during the last step (seconds, perf_counter)."""

    def __init__(self):
        self.start = self.end = 0.0
        self.passes: list[tuple[str, int, float, float]] = []   # (kind, micro-batch, compute start, compute end)

    @property
    def busy(self) -> float:
        return sum(end - start for _, _, start, end in self.passes)


class _MicroBatch:
    """What a forward pass leaves for its backward pass."""

    def __init__(self, tape, received, outputs, loss):
        self.tape = tape
        self.received = received    # edge id -> tensor (watched)
        self.outputs = outputs      # the stage sub-model's outputs
        self.loss = loss            # last stage: the scaled loss


class StageRunner:
    def __init__(self, partition: Partition, placement: Placement, channels, lookahead: int = 2):
        self.partition = partition
        self.placement = placement
        self.channels = channels
        self.lookahead = lookahead
        self.stage = placement.stage
        self.plan = partition.stages[self.stage]
        self.model = self.plan.model
        self.edges_in = partition.edges_into(self.stage)
        self.edges_out = partition.edges_out_of(self.stage)
        self.trace = StepTrace()
        self._forward = {training: self._compile_forward(training) for training in (True, False)}

    # --- compiled stage computation -----------------------------------------------

    def _compile_forward(self, training: bool):
        model = self.model
        specs = [tf.TensorSpec((None,) + tuple(t.shape[1:]), t.dtype) for t in model.inputs]

        @tf.function(input_signature=[specs], reduce_retracing=True)
        def forward(inputs):
            outputs = model(inputs, training=training)
            return [tf.convert_to_tensor(o) for o in keras.tree.flatten(outputs)]
        return forward

    # --- messages ------------------------------------------------------------------

    def _tag(self, micro_batch: int, edge: int, backward: bool) -> int:
        return (micro_batch * len(self.partition.edges) + edge) * 2 + int(backward)

    def _post_receives(self, p: Pass, sizes: list[int], posted: dict) -> None:
        if p in posted or sizes[p.micro_batch] == 0:
            return
        n = sizes[p.micro_batch]
        handles = {}
        if p.kind == FORWARD:
            for edge in self.edges_in:
                out = np.empty((n,) + edge.shape, tf.as_dtype(edge.dtype).as_numpy_dtype)
                handles[edge.id] = self.channels.receive(self.placement.peer(edge.source),
                                                         self._tag(p.micro_batch, edge.id, False), out)
        else:
            for edge in self.edges_out:
                if edge.differentiable:
                    out = np.empty((n,) + edge.shape, tf.as_dtype(edge.dtype).as_numpy_dtype)
                    handles[edge.id] = self.channels.receive(self.placement.peer(edge.target),
                                                             self._tag(p.micro_batch, edge.id, True), out)
        posted[p] = handles

    @staticmethod
    def _collect(handles: dict) -> dict:
        arrays = {}
        for edge, handle in handles.items():
            handle.wait()
            arrays[edge] = tf.convert_to_tensor(handle.buffer)
        return arrays

    # --- one step --------------------------------------------------------------------

    def run(self, passes: list[Pass], sizes: list[int], inputs_of, last_stage_loss, training: bool = True):
        """Run `passes` over micro-batches of `sizes` samples.

        inputs_of(m): first stage only, the flat model inputs of micro-batch m.
        last_stage_loss(m, y_pred_flat): last stage only, the scaled loss of micro-batch m
        (None when not training). Returns, on the last stage, {m: flat y_pred}, and, when
        training, the summed weight gradients (None where a variable got none)."""
        self.trace = StepTrace()
        self.trace.start = time.perf_counter()
        variables = self.model.trainable_variables
        gradients = [None] * len(variables)
        posted, sends, live, predictions = {}, [], {}, {}
        for index, p in enumerate(passes):
            for ahead in passes[index:index + 1 + self.lookahead]:
                self._post_receives(ahead, sizes, posted)
            m = p.micro_batch
            if sizes[m] == 0:
                continue
            arrived = self._collect(posted.pop(p))
            begin = time.perf_counter()
            if p.kind == FORWARD:
                live[m], new_sends, y_pred = self._forward_pass(m, arrived, inputs_of, last_stage_loss, training)
                if y_pred is not None:
                    predictions[m] = y_pred
            else:
                new_sends = self._backward_pass(m, live.pop(m), arrived, variables, gradients)
            self.trace.passes.append((p.kind, m, begin, time.perf_counter()))
            sends.extend(new_sends)
        for handle in sends:
            handle.wait()
        self.trace.end = time.perf_counter()
        return predictions, gradients

    def _forward_pass(self, m, arrived, inputs_of, last_stage_loss, training):
        received = arrived
        if self.placement.is_first_stage:
            inputs = inputs_of(m)
        else:
            inputs = [received[e] for e in self.plan.input_edges]
        tape = tf.GradientTape() if training else None
        if tape is not None:
            tape.__enter__()
            tape.watch([t for e, t in received.items() if self.partition.edges[e].differentiable])
        try:
            outputs = self._forward[training](inputs)
            loss, y_pred = None, None
            if self.placement.is_last_stage:
                y_pred = [outputs[i] if kind == "computed" else received[i] for kind, i in self.plan.model_outputs]
                loss = last_stage_loss(m, y_pred)
        finally:
            if tape is not None:
                tape.__exit__(None, None, None)
        sends = []
        for output, edges in zip(outputs, self.plan.output_edges):
            payload = output.numpy()
            for e in edges:
                edge = self.partition.edges[e]
                sends.append(self.channels.send(self.placement.peer(edge.target), self._tag(m, e, False), payload))
        state = _MicroBatch(tape, received, outputs, loss) if training else None
        return state, sends, y_pred

    def _backward_pass(self, m, state: _MicroBatch, arrived, variables, gradients):
        if self.placement.is_last_stage:
            targets, output_gradients = [state.loss], None
        else:
            targets, output_gradients = [], []
            for output, edges in zip(state.outputs, self.plan.output_edges):
                grads = [arrived[e] for e in edges if e in arrived]
                if grads:
                    targets.append(output)
                    output_gradients.append(tf.add_n(grads) if len(grads) > 1 else grads[0])
        sources = [e for e in state.received if self.partition.edges[e].differentiable]
        results = state.tape.gradient(targets, [state.received[e] for e in sources] + list(variables),
                                      output_gradients=output_gradients,
                                      unconnected_gradients=tf.UnconnectedGradients.NONE)
        sends = []
        for e, grad in zip(sources, results[:len(sources)]):
            if grad is None:
                grad = tf.zeros_like(state.received[e])
            edge = self.partition.edges[e]
            sends.append(self.channels.send(self.placement.peer(edge.source), self._tag(m, e, True),
                                            np.ascontiguousarray(tf.convert_to_tensor(grad).numpy())))
        for i, grad in enumerate(results[len(sources):]):
            if grad is not None:
                grad = tf.convert_to_tensor(grad)
                gradients[i] = grad if gradients[i] is None else gradients[i] + grad
        return sends
