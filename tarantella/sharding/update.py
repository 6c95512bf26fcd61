"""ZeRO stages 1-3: each rank keeps the optimizer state of its own variables only (shard="optimizer"), also
receives only their summed gradients (shard="gradients"), and also holds only their weights (shard="weights");
tnt.Model, tnt.shard_optimizer.

Note [A sharded update]
Under shard="optimizer" every rank has the summed gradients of every variable
(the fused allreduce, as without sharding); under shard="gradients" only its
own variables' (Note [Gradients summed on their owners] in
gradients_to_owners.py); under shard="weights" too, summed in each layer's
backward pass, and the new values are not handed over: the other ranks gather
them when a layer needs them (Note [Weights gathered layer by layer] in
gathered_weights.py). The optimizer, the user's unchanged Keras optimizer, is
built on this rank's variables only (Note [Whole variables to owners,
balanced by bytes] in owners.py), so its slots, EMA copies and gradient
accumulators exist for them alone: 1/N of the optimizer state per rank. Each
rank applies the update of its own variables and hands the new values to the
others (Note [Handing the updated weights over] in handoff.py). Two of
Keras's rules are about the whole model, not a variable, and are decided
here, over every variable's gradients, identically on every rank (under
shard="optimizer" they all hold the same summed gradients; under "gradients"
each owner computes its variables' figures, a squared sum, whether all are
finite, whether there is a gradient, and one small allreduce gives them to
every rank: adding zeros is exact, so every rank holds the owners' bits):
- `global_clipnorm`: the norm over all gradients. It is held off the
  optimizer while it applies its part (it would clip by that part's norm;
  its config keeps it, so a saved file does too) and the owned gradients are
  scaled by Keras's own factor, computed with Keras's arithmetic
  (clip_by_global_norm in keras/src/optimizers/base_optimizer.py) on the
  gradients the optimizer would have clipped: unscaled by a
  LossScaleOptimizer's scale. Scaling before that unscaling rather than
  after gives the same bits: the dynamic scale is a power of two.
- a LossScaleOptimizer's decision to skip the step: its own check_finite over
  all gradients; if any is not finite, the owned ones are made NaN, so the
  owner's LossScaleOptimizer skips and lowers its scale as every other does.
Everything per variable (clipnorm, clipvalue, weight decay and its
exclusions, EMA, gradient accumulation, learning-rate schedules, which read
the shared iteration count) runs in the optimizer as in serial Keras. So the
weights equal unsharded training's bit for bit (tnt-repro's exact mode finds
them IDENTICAL to serial's). One exception was measured: TensorFlow's graph
optimiser (Grappler's arithmetic optimizer) rewrites the tensor of a
learning-rate schedule according to how many updates consume it, and a
sharded step has fewer of them; RMSprop with ExponentialDecay then differs
from unsharded by an ulp of the update (3e-8 after 2 epochs), as both do from
serial. With that pass off (tf.config.optimizer.set_experimental_options(
{"arithmetic_optimization": False})) they are equal again.
"""
from __future__ import annotations

import contextlib
import logging

import keras
import tensorflow as tf

from tarantella import channels, config, runtime
from tarantella.step.in_graph_sum import InGraphSum
from tarantella.step.optimizers import unscaled_optimizer
from tarantella.sharding import checkpoint, gathered_weights
from tarantella.sharding.gradients_to_owners import GradientsToOwners
from tarantella.sharding.handoff import WeightHandoff
from tarantella.sharding.owners import assign_owners, describe, variable_bytes
from tarantella.timeline import graph_marks

__all__ = ["MODES", "resolve_mode", "ShardedUpdate", "shard_optimizer", "shard_model_optimizer", "sharding_of",
           "reduction_to_owners"]

logger = logging.getLogger("tarantella")

MODES = config.SHARD_MODES   # ZeRO stages 1, 2, 3
_OFF = ("", "off", "none")


def resolve_mode(shard) -> str | None:
    """tnt.Model's `shard` argument (None: the launcher's --shard) as a mode, or None for no sharding."""
    if shard is None:
        shard = runtime.settings().shard
    if shard is False or (isinstance(shard, str) and shard.strip().lower() in _OFF):
        return None
    if shard not in MODES:
        raise ValueError(f"tarantella: shard={shard!r} is not a sharding mode; use one of "
                         f"{', '.join(map(repr, MODES))} "
                         f"(ZeRO stages 1-3) or None")
    return shard


class ShardedUpdate:
    """The sharding of one optimizer over the variables it is built on; made on every rank, in the same order
    (opens channels: a collective). `build` builds the optimizer (default: its own build). `mode`: "optimizer"
    (stage 1) or "gradients" (stage 2: `reduce_to_owners` sums the gradients). `group`: the collectives.Group
    whose members `size` and `rank` count, for mode "optimizer" (None: the world; a pipeline stage's replicas,
    Note [A stage's replicas share its optimizer state] in tarantella/pipelining/step_collectives.py)."""

    def __init__(self, variables: list, optimizer, size: int, rank: int, build=None, mode: str = "optimizer",
                 group=None):
        if group is not None and mode != "optimizer":
            raise ValueError(f"tarantella: shard={mode!r} shards over all ranks; only shard='optimizer' shards "
                             f"over a group of them")
        self.variables = list(variables)
        sizes = [variable_bytes(v) for v in self.variables]
        # shard="weights": the owners are the ranks that hold the weights (gathered_weights.py drew them over the
        # whole model; an optimizer of some of its variables, a GAN's, takes theirs)
        self.owners = (_holders(self.variables) if mode == "weights" and size > 1 else assign_owners(sizes, size))
        self.rank, self.size, self.group = rank, size, group
        self.owned = [v for v, owner in zip(self.variables, self.owners) if owner == rank]
        self._owner_and_tag = {id(v): (owner, tag) for tag, (v, owner) in enumerate(zip(self.variables, self.owners))}
        _check_shardable(optimizer, self.variables, size, mode)
        logger.info("tarantella: shard=%r: %s", mode, describe(sizes, self.owners, size))
        inner = unscaled_optimizer(optimizer)
        # Note [A sharded update]: the whole model's norm is taken here, not by the optimizer.
        self.global_clipnorm = inner.global_clipnorm
        (build or optimizer.build)(self.owned)
        _finalize_owned_only(optimizer, self)
        self.mode = mode
        # shard="weights": the owners keep their weights, which the others gather per layer (gathered_weights.py)
        self.handoff = (None if mode == "weights" else
                        WeightHandoff(rank, size, channels.open_channels(), sum(sizes), group))
        self._to_owners = (GradientsToOwners(rank, size, channels.open_channels(), sum(sizes))
                           if mode == "gradients" else None)
        # The whole-model figures of stages 2 and 3 (Note [A sharded update]); made now, collectively.
        self._figures_allreduce = (InGraphSum() if mode != "optimizer" and (
            self.global_clipnorm or hasattr(optimizer, "inner_optimizer")) else None)

    def gradient_sends(self) -> int | None:
        """Gradients this rank has sent to their owners so far (shard="gradients"; None otherwise): tnt-repro's
        evidence that training was distributed (Note [Refusing runs that distributed nothing])."""
        return None if self._to_owners is None else int(self._to_owners.sends.variable.numpy())

    def reduce_to_owners(self, gradients: list, variables: list, overlap: bool = True) -> list:
        """Traced, shard="gradients": the sum over the ranks of each of this rank's (weighted) `gradients` of
        `variables` on its owner, None on the other ranks (Note [Gradients summed on their owners]).
        overlap=False: nothing is sent before every gradient exists (tnt.Model's overlap_communication)."""
        owners, tags = zip(*[self._owner_and_tag[id(v)] for v in variables]) if variables else ((), ())
        return self._to_owners(list(gradients), list(owners), list(tags), overlap)

    def apply(self, optimizer, gradients, variables, apply=None) -> None:
        """Traced: update this rank's share of `variables` (some or all of those the optimizer was built on) with
        their summed gradients, then every rank gets every new value (Note [A sharded update]). `apply`: the
        optimizer's own apply (default: optimizer.apply)."""
        variables = list(variables)
        unknown = [v.path for v in variables if id(v) not in self._owner_and_tag]
        if unknown:
            raise ValueError(f"tarantella: the sharded {type(optimizer).__name__} was built on other variables than "
                             f"{unknown[:3]}; apply it to (a part of) the variables it was built on")
        owners, tags = zip(*[self._owner_and_tag[id(v)] for v in variables]) if variables else ((), ())
        mine = [i for i, owner in enumerate(owners) if owner == self.rank]
        if variables and not mine:
            raise ValueError(f"tarantella: rank {self.rank} owns none of the {len(variables)} variables this "
                             f"{type(optimizer).__name__}.apply updates, so its iteration count would fall behind; "
                             f"apply the optimizer to more variables at once, or do not shard it")
        gradients = self._whole_model_decisions(optimizer, list(gradients), [i in mine for i in range(len(owners))])
        with _global_clipnorm_held_off(optimizer):
            (apply or optimizer.apply)([gradients[i] for i in mine], [variables[i] for i in mine])
        if self.handoff is None:   # shard="weights": nobody else holds them
            return
        # The receives are posted once this rank's own updates are written (Note [Handing the updated weights over]).
        with tf.control_dependencies([tf.convert_to_tensor(variables[i]) for i in mine]):
            done = graph_marks.mark(tf.identity(tf.convert_to_tensor(optimizer.iterations)),
                                    graph_marks.OWN_UPDATES)  # timeline only
        self.handoff(variables, list(owners), list(tags), done)

    def _whole_model_decisions(self, optimizer, gradients: list, owned: list) -> list:
        scaled = hasattr(optimizer, "inner_optimizer")
        if not (self.global_clipnorm or scaled):
            return gradients
        if self._figures_allreduce is None:  # every rank holds every summed gradient
            finite = optimizer.check_finite(gradients) if scaled else None
            squared = [_squared_sum(g) for g in _as_the_optimizer_clips_them(optimizer, gradients) if g is not None]
        else:
            finite, squared = self._exchanged_figures(optimizer, gradients, owned)
        if self.global_clipnorm:
            factor = _global_clip_factor(squared, self.global_clipnorm)
            # As clip_by_global_norm scales them (`v * scale`): a tf.IndexedSlices (an Embedding's) becomes dense
            # there too, and Keras's optimizers update dense and sparse gradients differently.
            gradients = [g if g is None else g * tf.cast(factor, g.dtype) for g in gradients]
        if scaled:
            gradients = [g if g is None else _map_values(g, lambda v: tf.where(finite, v, tf.constant(float("nan"),
                                                                                                       v.dtype)))
                         for g in gradients]
        return gradients

    def _exchanged_figures(self, optimizer, gradients: list, owned: list):
        """Stage 2: (all gradients finite, [squared sum of each gradient as the optimizer clips it]), every rank
        alike, from the owners' figures (Note [A sharded update]). Sums are exchanged in float64, which holds
        float32 and 16-bit values exactly, so every rank gets the owner's bits."""
        clipped = _as_the_optimizer_clips_them(optimizer, gradients)
        zero = tf.zeros([], tf.float64)
        rows = [[tf.cast(_squared_sum(g), tf.float64), tf.cast(tf.logical_not(keras.ops.all(keras.ops.isfinite(g))),
                                                               tf.float64), tf.ones([], tf.float64)]
                if mine and g is not None else [zero, zero, zero] for g, mine in zip(clipped, owned)]
        figures = self._figures_allreduce(tf.stack([tf.stack(row) for row in rows]))
        squared = tf.boolean_mask(figures[:, 0], figures[:, 2] > 0)
        dtype = next((g.dtype for g in gradients if g is not None), tf.float32)
        return tf.reduce_sum(figures[:, 1]) == 0, tf.cast(squared, dtype)


def shard_optimizer(optimizer, variables=None, mode: str = "optimizer"):
    """Keep only this rank's share of `optimizer`'s state (ZeRO stage 1), in place; returns the optimizer. With
    mode="gradients" (stage 2) its gradients are summed on their owners only (reduction_to_owners); with
    mode="weights" (stage 3) it updates the weights of a model sharded by tnt.shard_weights, whose gradients
    tnt.gathered_gradients gives (tarantella/keras/custom_loop.py).

    Its build(variables) (Keras's, or the first apply's) builds it on this rank's share of them (Note [Whole
    variables to owners, balanced by bytes] in owners.py), and its apply(grads, variables), given gradients
    already summed over the ranks (tnt.reduce_gradients in a custom loop; tnt.Model's steps), updates this rank's
    share and hands the new values to every rank (Note [A sharded update]). With `variables` it is built at once
    (a collective: every rank, same variables, same order); otherwise when Keras builds it, on every rank alike."""
    return _shard(optimizer, variables, mode)


def _shard(optimizer, variables, mode: str, group=None):
    if sharding_of(optimizer) is not None or getattr(optimizer, "_tnt_shards", False):
        return optimizer
    local_build, local_apply = optimizer.build, optimizer.apply
    size, rank = (runtime.get_size(), runtime.get_rank()) if group is None else (group.size, group.rank)

    def build(var_list):
        with tf.init_scope():  # its state is made eagerly, also when first built inside a traced step
            optimizer._tnt_sharded_update = ShardedUpdate(var_list, optimizer, size, rank, build=local_build,
                                                          mode=mode, group=group)
            checkpoint.pending_share(optimizer)   # a loaded model's (Note [Saving a model with its own ...])

    def apply(grads, trainable_variables=None):
        update = sharding_of(optimizer)
        if update is None:
            if trainable_variables is None:
                raise ValueError("tarantella: a sharded optimizer is built on its first apply's variables: call "
                                 "apply(grads, variables)")
            build(list(trainable_variables))
            update = sharding_of(optimizer)
        update.apply(optimizer, grads, update.variables if trainable_variables is None else trainable_variables,
                     apply=local_apply)

    optimizer.build, optimizer.apply = build, apply
    optimizer._tnt_shards = mode
    optimizer._tnt_sharded_update = None
    if variables is not None:
        build(list(variables))
    return optimizer


def shard_model_optimizer(optimizer, mode: str, group=None):
    """tnt.Model's sharding of its optimizer, in any mode (shard="weights" included: the model gathers); a
    pipeline stage's over its replicas (`group`, mode "optimizer")."""
    return _shard(optimizer, None, mode, group)


def sharding_of(optimizer) -> ShardedUpdate | None:
    """The sharding of an optimizer made by shard_optimizer, once it is built (else None)."""
    return getattr(optimizer, "_tnt_sharded_update", None)


def reduction_to_owners(optimizer, variables: list):
    """For an optimizer sharded with mode="gradients": the sharding whose reduce_to_owners sums gradients of
    `variables` (building the optimizer on them if it is not built yet: a collective, traced on every rank alike).
    None for any other optimizer (its gradients are allreduced)."""
    if getattr(optimizer, "_tnt_shards", None) != "gradients":
        return None
    if sharding_of(optimizer) is None:
        optimizer.build(list(variables))
    return sharding_of(optimizer)


def _as_the_optimizer_clips_them(optimizer, gradients: list) -> list:
    """The gradients as Keras's optimizer would clip them: divided by a LossScaleOptimizer's dynamic scale
    (its _stateful_handle_finite_grads) and by the inner optimizer's loss_scale_factor (its apply)."""
    if hasattr(optimizer, "inner_optimizer"):
        gradients = [g if g is None else keras.ops.divide(g, optimizer.dynamic_scale) for g in gradients]
    factor = unscaled_optimizer(optimizer).loss_scale_factor
    if factor is not None:
        gradients = [g if g is None else g / factor for g in gradients]
    return gradients


@contextlib.contextmanager
def _global_clipnorm_held_off(optimizer):
    """Within (while its apply is traced): the optimizer does not clip by the norm of its own part (Note [A sharded
    update])."""
    inner = unscaled_optimizer(optimizer)
    kept, inner.global_clipnorm = inner.global_clipnorm, None
    try:
        yield
    finally:
        inner.global_clipnorm = kept


def _squared_sum(gradient):
    """A gradient's term of Keras's global_norm, by its arithmetic."""
    return keras.ops.sum(keras.ops.square(gradient))


def _global_clip_factor(squared_sums, clip_norm: float):
    """Keras's clip_by_global_norm scale factor from the gradients' squared sums, by Keras's arithmetic
    (global_norm, then the factor), so that the clipped gradients have the bits the optimizer would give them."""
    ops = keras.ops
    use_norm = ops.sqrt(ops.sum(ops.stack(squared_sums) if isinstance(squared_sums, list) else squared_sums))
    return clip_norm * ops.minimum(1.0 / use_norm, 1.0 / clip_norm) + (use_norm - use_norm)


def _map_values(gradient, function):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(function(gradient.values), gradient.indices, gradient.dense_shape)
    return function(gradient)


def _check_shardable(optimizer, variables: list, size: int, mode: str = "optimizer") -> None:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"tarantella: shard={mode!r} shards a Keras optimizer; got {type(optimizer).__name__}")
    inner = unscaled_optimizer(optimizer)
    if inner.global_clipnorm and inner.gradient_accumulation_steps:
        raise ValueError(f"tarantella: shard={mode!r} cannot combine global_clipnorm with "
                         f"gradient_accumulation_steps in {type(inner).__name__}: the norm of the accumulated "
                         f"gradients would need every rank's accumulators; clip with clipnorm, or do not shard")
    if len(variables) < size:
        raise ValueError(f"tarantella: shard={mode!r} gives every rank whole variables to update, and this model "
                         f"has {len(variables)} trainable variables for {size} ranks; train it unsharded or on at "
                         f"most {len(variables)} ranks")
    if optimizer.built:
        raise ValueError(f"tarantella: shard={mode!r} builds the optimizer on this rank's variables only, and "
                         f"{type(optimizer).__name__} is already built; shard a new optimizer")


def _holders(variables: list) -> list:
    """shard="weights": the rank holding each variable (Note [Weights gathered layer by layer])."""
    gathering = gathered_weights.gathering_of(variables)
    owners = [None if gathering is None else gathering.owner_of(v) for v in variables]
    stray = [v.path for v, owner in zip(variables, owners) if owner is None]
    if stray:
        raise ValueError(f"tarantella: shard='weights' updates the weights of a model sharded by "
                         f"tnt.shard_weights(model) (or tnt.Model(model, shard='weights')); {stray[:3]} are not "
                         f"among them")
    return owners


def _finalize_owned_only(optimizer, update: ShardedUpdate) -> None:
    """Keras ends fit with optimizer.finalize_variable_values(model.trainable_weights) (EMA: the weights take
    their averages). The averages exist for the owned variables only: those are finalized by their owner, then
    handed to the others (a collective, at the end of fit on every rank)."""
    finalize = optimizer.finalize_variable_values

    def finalize_variable_values(var_list):
        finalize(update.owned)
        if unscaled_optimizer(optimizer).use_ema and len(set(update.owners)) > 1 and update.handoff is not None:
            for variable, value in zip(update.variables, gathered_weights.values_from_owners(
                    update.variables, update.owners, update.rank, update.size, update.group)):
                variable.assign(value)

    optimizer.finalize_variable_values = finalize_variable_values
