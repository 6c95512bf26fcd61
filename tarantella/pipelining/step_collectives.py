"""What a pipeline step exchanges beyond its stage's own transfers: with the stage's replicas (gradients,
BatchNormalization's statistics) and with the other stages of its replica (Note [One model across the
stages]). All traced into the step's graph (pipelined_model.py builds it).

Note [One model across the stages]
Each stage's optimizer sees only its own gradients, but some of Keras's
semantics are about the whole model. The earlier stages' layer losses
(add_loss, regularizers; the last stage's are already in its loss through
compute_loss) are part of the logged loss: each earlier stage sends their
size-weighted sum to the last stage of its replica in the step's graph, one
way, as soon as its last forward has run, so no stage waits for another's end
of step. Only when the update needs the whole model do the stages of a
replica meet at the end of the step: they allreduce the sum of squares of
their (replica-summed) gradients, from which every stage computes the same
global norm, so `global_clipnorm` (taken off the stage's optimizer at compile
and applied here, unscaled under a LossScaleOptimizer) clips by the whole
model's norm; and if any stage's gradients are not finite every stage's
gradients are made NaN, so every stage's LossScaleOptimizer takes the same
decision (skip the step and lower the scale) and their scales stay equal.
Without either, a stage applies its update as soon as its own passes are done
(the first stage's drain then overlaps the last stage's update).

Note [A stage's replicas share its optimizer state]
With data-parallel replicas (ALL) and shard="optimizer" (ZeRO stage 1), a
stage's optimizer is sharded over the stage's replicas as data parallelism's
is over the world (Note [A sharded update] in tarantella/sharding/update.py):
each replica keeps the slots of its own share of the stage's variables (whole
variables to owners, balanced by bytes), updates them once the replicas'
gradient allreduce is done, and hands the new values to the stage's other
replicas (Note [Handing the updated weights over]); so each rank holds 1/R of
its stage's optimizer state. The decisions about the whole model stay the
pipeline's (Note above): they act on the replica-summed gradients, which every
replica holds whole, before the sharded update reads them, so a
LossScaleOptimizer's check there agrees on every replica. Saving takes each
slot from the rank that holds it (stage_state.gather_optimizer_on_master takes
a name from its lowest holder), loading keeps each rank's own (by name). Stages
2 and 3 are refused, as DeepSpeed's pipeline engine refuses ZeRO-2 and -3: a
stage sums its gradients over the micro-batches, so they exist whole on every
replica until its last backward (stage 2 would save nothing at the peak), and
stage 3 would gather every layer's weights once per micro-batch and pass.
"""
from __future__ import annotations

import logging

import tensorflow as tf

from tarantella import collectives, runtime
from tarantella.step.graph_allreduce import GraphAllreducer
from tarantella.step.in_graph_sum import InGraphSum
from tarantella.pipelining.compiled_step import LAYER_LOSSES_TAG, StageStep
from tarantella.pipelining.topology import Placement

__all__ = ["StepCollectives", "check_shard"]

logger = logging.getLogger("tarantella")


def check_shard(shard, shard_optimizer) -> None:
    """Note [A stage's replicas share its optimizer state]: the ZeRO stage a pipeline takes, and sharding's update,
    which the faces hand it (shard_optimizer)."""
    if shard not in (None, "optimizer"):
        raise ValueError(f"tarantella: shard={shard!r} (or the launcher's --shard) is not available with pipelining "
                         f"(PIPELINING or ALL): a stage sums its gradients over the micro-batches, so only the "
                         f"optimizer state is sharded over a stage's replicas (as DeepSpeed's pipeline engine allows "
                         f"ZeRO-1 only); use shard='optimizer', or ParallelStrategy.DATA")
    if shard is not None and shard_optimizer is None:
        raise ValueError("tarantella: a pipeline's shard='optimizer' needs sharding's update, which the faces "
                         "hand it: build the model with tnt.Model(model, parallel_strategy=tnt.ParallelStrategy."
                         "ALL, shard='optimizer') or tarantella.pipeline.make_pipelined_model(..., shard=...)")


class StepCollectives:
    """Made collectively on every rank: the stage's group (its replicas) and the replica's group (its
    stages); the allreducers are made when first traced, in the same order on every rank of a group."""

    def __init__(self, placement: Placement, runner: StageStep, shard_optimizer=None):
        self.placement = placement
        # shard="optimizer": sharding's update, handed by the face (tarantella/pipeline/__init__.py), called as
        # shard_optimizer(optimizer, group=...); pipelining imports no other strategy
        self._shard_optimizer = shard_optimizer
        self.runner = runner
        size = runtime.get_size()
        self.stage_group = collectives.Group.world().split(placement.stage) if size > 1 else None
        self.pipeline_group = collectives.Group.world().split(placement.replica) if placement.num_stages > 1 \
            else None
        self.gradient_allreducer = None
        self._pipeline_allreducer = None
        self._statistics_allreducer = None

    def sum_over_replicas(self, gradients):
        """Traced: the sum over the stage's replicas, through the fused reducer's graph ops."""
        if self.placement.num_replicas == 1 or not gradients:
            return gradients
        if self.gradient_allreducer is None:
            # Registered in backprop order (the reverse of the variables), as data parallelism does.
            backward = gradients[::-1]
            self.gradient_allreducer = GraphAllreducer([g.shape for g in backward], [g.dtype for g in backward],
                                                       group=self.stage_group)
        return self.gradient_allreducer(gradients[::-1])[::-1]

    def share_optimizer_state(self, optimizer) -> None:
        """shard="optimizer": the stage's optimizer sharded over the stage's replicas when it is built (Note [A
        stage's replicas share its optimizer state])."""
        if self.placement.num_replicas == 1:
            logger.info("tarantella: shard='optimizer' with one replica per stage keeps each stage's optimizer "
                        "state whole (there are no replicas to share it)")
            return
        self._shard_optimizer(optimizer, group=self.stage_group)

    def statistics_allreduce(self, tensor):
        """The sum over this stage's replicas of a small tensor a layer needs at once (BatchNormalization's
        statistics, Note [A pipeline's micro-batches and the layers that look at the batch])."""
        if self._statistics_allreducer is None:
            self._statistics_allreducer = InGraphSum(group=self.stage_group)
        return self._statistics_allreducer(tensor)

    def add_layer_losses_of_earlier_stages(self, penalty, start, loss_tracker) -> list:
        """Traced (Note [One model across the stages]): each earlier stage sends the size-weighted sum of its
        layers' losses to the last stage of its replica, which adds them to the logged loss. One way, and
        available after the earlier stage's last forward: no stage waits for another's end of step.
        Returns the send tokens."""
        if self.pipeline_group is None:
            return []
        last = self.placement.num_stages - 1
        if not self.placement.is_last_stage:
            # `start` keeps the value from being a constant (graph optimisation must not run a transfer).
            value = tf.cast(penalty, tf.float64) + tf.cast(start, tf.float64) * 0.0
            return [self.runner.send_control(value, last, LAYER_LOSSES_TAG)]
        received = [self.runner.receive_control(start, (), tf.float64, s, LAYER_LOSSES_TAG) for s in range(last)]
        total = loss_tracker.total
        total.assign_add(tf.cast(tf.add_n(received), total.dtype))
        return []

    def decides_across_stages(self, optimizer, global_clipnorm) -> bool:
        """Whether the update needs the whole model's gradients' norm (global_clipnorm) or its finiteness
        (a LossScaleOptimizer's one decision): then the stages of a replica meet at the end of the step."""
        return self.pipeline_group is not None and bool(global_clipnorm or hasattr(optimizer, "inner_optimizer"))

    def decide_across_stages(self, gradients, start, optimizer, global_clipnorm):
        """Traced, collective over the replica's stages (Note [One model across the stages]): the gradients
        get the whole model's global_clipnorm and, under a LossScaleOptimizer, its one decision to skip the
        step."""
        squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in gradients]) if gradients \
            else tf.constant(0.0, tf.float64)
        # `start` (a function argument) keeps the value from being a constant: graph optimisation would fold a
        # constant-input start op instead of running it every step.
        local = tf.reshape(squares + tf.cast(start, tf.float64) * 0.0, [1])
        if self._pipeline_allreducer is None:
            self._pipeline_allreducer = GraphAllreducer([local.shape], [local.dtype], group=self.pipeline_group)
        total_squares = self._pipeline_allreducer([local])[0][0]
        if not gradients:
            return gradients
        scaled = hasattr(optimizer, "inner_optimizer")
        if global_clipnorm:
            norm = tf.sqrt(total_squares)
            if scaled:
                norm = norm / tf.cast(optimizer.scale_loss(tf.constant(1.0)), tf.float64)
            clip = tf.constant(global_clipnorm, tf.float64)
            # As Keras's clip_by_global_norm: scale by clip / max(norm, clip); NaN if the norm is not finite.
            factor = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            gradients = [g * tf.cast(factor, g.dtype) for g in gradients]
        if scaled:
            # Every stage's LossScaleOptimizer sees non-finite gradients if any stage has them.
            poison = tf.where(tf.math.is_finite(total_squares), 0.0, float("nan"))
            gradients = [g + tf.cast(poison, g.dtype) for g in gradients]
        return gradients
