"""tnt.Model: a Keras 3 model trained data-parallel over all ranks.

    model = tnt.Model(keras_model)
    model.compile(...); model.fit(x, y, batch_size=GLOBAL_BATCH, ...)

Only public Keras extension points are used: this is a keras.Model subclass
that wraps the user's model (`call` delegates to it) and overrides
train/test/predict_step (tarantella/step/tf_steps.py), fit/evaluate/predict
(to shard the input, tarantella/data) and get_metrics_result (global metric
values, tarantella/step/metric_reduction.py).

Note [What differs from serial training]
Losses, gradients, updates and logged metrics are those of the global batch
(Note [Loss of the global batch] in tf_steps.py), and the layers that look at
the batch behave as on the whole global batch in one process: random layers
draw each sample's serial values (Note [Random values by sample, not by rank]
in serial_random.py) and BatchNormalization uses the global batch's statistics
(Note [BatchNormalization over the global batch] in global_batch_norm.py). So
training reproduces serial Keras up to float rounding, and every rank keeps
identical weights and moving statistics. What still differs: random ops that
serial_random.py does not recognise (warned about once), and, by choice,
`batch_norm="local"` (each micro-batch's own statistics, per-rank moving
statistics, the master's saved: Horovod's and the original Tarantella's way).

Note [A model's own training logic]
A wrapped model that overrides train_step, test_step, predict_step,
compute_loss or compute_metrics keeps its logic: tnt.Model runs the wrapped
model's steps (tarantella/keras/user_steps.py) with its optimizers distributed
(Note [Distributing through the optimizer] in distributed_optimizer.py), its
metrics are the model's metrics, and compile() is the wrapped model's own
(a GAN's compile(d_optimizer=..., g_optimizer=...)). Models without overrides
take the direct path (tf_steps.py), which scales the loss instead.
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, deferred_build, runtime, sharding, timeline
from tarantella._repro import exact_train_step
from tarantella._repro import hook as repro_hook
from tarantella.elastic import fit_commits
from tarantella.data import distributed_dataset, order_check, serial_order, user_input
from tarantella.keras import class_weights, distributed_optimizer, models, user_steps
from tarantella.keras.model_files import ModelFiles
from tarantella.keras.parallel_strategy import ParallelStrategy
from tarantella.keras.wrapping import Wrapping
from tarantella.pipeline import entry
from tarantella.sharding.sharded_model import ShardedModel
from tarantella.step import (batch_position, empty_micro_batch, global_batch_norm, initial_weights, metric_reduction,
                             optimizers, rank_callbacks, serial_random, tf_steps)
from tarantella.step.step_reductions import StepReductions
from tarantella.timeline import step_events

__all__ = ["Model"]


def _reductions_attribute(name: str) -> property:
    """An attribute of tnt.Model's StepReductions, read and set through the model."""
    return property(lambda model: getattr(model._reductions, name),
                    lambda model, value: setattr(model._reductions, name, value))


class Model(Wrapping, ModelFiles, keras.Model):
    """Wraps `model` for synchronous data-parallel training; behaves like it otherwise.

    overlap_communication=False starts the gradient allreduce (with shard="gradients": the transfers to the
    owners) only once the whole backprop is done (for measuring what overlap buys).
    batch_norm="global" (default): BatchNormalization uses the global batch's statistics, as serial Keras;
    "local": each rank's micro-batch statistics (Note [What differs from serial training]).
    shard="optimizer": each rank keeps the optimizer state of its own share of the variables only (ZeRO stage 1,
    Note [A sharded update] in tarantella/sharding/update.py); "gradients": it also receives only their summed
    gradients (stage 2, Note [Gradients summed on their owners] in tarantella/sharding/gradients_to_owners.py);
    "weights": it also holds only their weights, which each layer gathers when it runs (stage 3, Note [Weights
    gathered layer by layer] in tarantella/sharding/gathered_weights.py); None: the launcher's --shard (default
    off). With ALL, "optimizer" shards each stage's optimizer state over the stage's replicas (Note [A stage's
    replicas share its optimizer state] in tarantella/pipelining/step_collectives.py); stages 2-3 not."""

    # What tnt-repro's records call this model's strategy (read there without importing this module).
    tnt_strategy = "data parallel (tnt.Model)"

    def __new__(cls, model=None, parallel_strategy=ParallelStrategy.DATA, *args, **kwargs):
        """PIPELINING and ALL give the pipelined model (tarantella.pipeline), which
        takes num_micro_batches, schedule and num_pipeline_stages."""
        if isinstance(parallel_strategy, ParallelStrategy) and ParallelStrategy.PIPELINING in parallel_strategy:
            overridden = user_steps.overridden(model) if isinstance(model, keras.Model) else []
            shard = sharding.resolve_mode(kwargs.pop("shard", None))
            pipelined = entry.pipelined(model, overridden=overridden, shard=shard, arguments=kwargs,
                                        data_parallel=parallel_strategy == ParallelStrategy.ALL)
            if pipelined is not None:
                return pipelined
        return super().__new__(cls)   # one rank: Note [A pipelined model on one rank] (pipeline/entry.py)

    def __init__(self, model: keras.Model, parallel_strategy=ParallelStrategy.DATA,
                 overlap_communication: bool = True, name: str | None = None,
                 batch_norm: str = batch_position.GLOBAL_BATCH_NORM, shard: str | None = None, **pipelining):
        if isinstance(model, Model):
            raise TypeError("tarantella: this model is already a tnt.Model")
        if not isinstance(model, keras.Model):
            raise TypeError(f"tarantella: tnt.Model wraps a keras.Model, got {type(model).__name__}")
        if pipelining and parallel_strategy == ParallelStrategy.DATA:
            raise TypeError(f"tarantella: tnt.Model got unexpected arguments {sorted(pipelining)} (they are "
                            f"pipelining's: pass parallel_strategy=tnt.ParallelStrategy.PIPELINING or ALL)")
        if parallel_strategy != ParallelStrategy.DATA and not (
                runtime.get_size() == 1 and ParallelStrategy.PIPELINING in parallel_strategy):
            raise ValueError(f"tarantella: unknown parallel_strategy {parallel_strategy!r}; use "
                             f"tnt.ParallelStrategy.DATA, PIPELINING or ALL")
        batch_position.check_batch_norm(batch_norm)
        shard = sharding.resolve_mode(shard)
        super().__init__(name=name or model.name)
        serial_random.install()
        global_batch_norm.install()
        self.batch_norm = batch_norm
        self._model = model
        self.parallel_strategy = parallel_strategy
        self.overlap_communication = overlap_communication
        self.world_size = runtime.get_size()
        self.shard = shard
        self._reductions = StepReductions(self.world_size, overlap_communication)
        self._validation_dataset = None
        self._weights_synchronized = False
        self._metrics_local = False
        # Note [A model's own training logic]
        self._own_logic = user_steps.overridden(model)
        self._sharding = (ShardedModel(model, shard, bool(self._own_logic), runtime.get_rank(), self.world_size)
                          if shard and self.world_size > 1 else None)
        if self._gathering is not None:
            self._weights_synchronized = True   # every rank took its own weights from the master's
        else:
            # Data parallelism holds every weight (Note [Models built without storage] in deferred_build.py).
            deferred_build.initialize_all(model)
        if model.built or self._own_logic:  # a GAN need not be callable: its parts are built
            self.built = True
        if model.built:
            self._synchronize_weights()
        if model.compiled:
            if self._own_logic:
                self._compile_like_own_logic()
            else:
                models.compile_like(self, model)

    @property
    def _gathering(self):
        """shard="weights": the weights gathered layer by layer (Note [Weights gathered layer by layer] in
        tarantella/sharding/gathered_weights.py); else None."""
        return None if self._sharding is None else self._sharding.gathering

    @property
    def _sharded_update(self):
        """The sharding of the optimizer of the direct path once it is built (Note [A sharded update])."""
        return None if self._sharding is None else self._sharding.update(getattr(self, "optimizer", None))

    # --- compile -------------------------------------------------------------

    def compile(self, *args, jit_compile="auto", **kwargs):
        """As keras.Model.compile; for a model with its own training logic, the wrapped model's compile
        (e.g. a GAN's compile(d_optimizer, g_optimizer, loss_fn)).

        jit_compile: "auto" and False mean no XLA at every rank count (so 1-rank baselines compute what
        N ranks do); True is refused: the engine's ops are not XLA ops (README, "XLA")."""
        _check_jit_compile(jit_compile)
        if self._own_logic:
            self._model.compile(*args, **kwargs)
            self._compile_like_own_logic()
            return
        self._compile_direct(*args, **kwargs)

    def _compile_like_own_logic(self):
        """This model compiled for Keras's fit loop only; the steps, loss and metrics are the wrapped model's."""
        if self._sharding is not None:   # a loaded model's optimizers hold the whole state: each takes its share
            self._sharding.own_logic_compiled()
        super().compile(optimizer=self._model.optimizer or "rmsprop", jit_compile=False)
        self._distribute_own_optimizers()
        self._reductions.close()

    def _distribute_own_optimizers(self) -> None:
        """The wrapped model's optimizers reduce their gradients, sharded with shard="optimizer" (the sharded apply
        below the reduction)."""
        for optimizer in optimizers.optimizers_of(self._model):
            if self._sharding is not None:
                self._sharding.shard_own(optimizer)
            distributed_optimizer.distribute_optimizer(optimizer)

    def _compile_direct(self, optimizer="rmsprop", loss=None, metrics=None, **kwargs):
        tf_steps.check_loss_reduction(loss)
        sharded = self._sharding is not None
        if sharded:
            optimizer = self._sharding.compiled_optimizer(optimizer)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=False, **kwargs)
        # The wrapped model is compiled alike so that its saved file is complete: sharing the optimizer, or, when
        # sharded, with an unbuilt copy that gets every rank's state only to be saved (save()).
        self._model.compile(optimizer=optimizers.unbuilt_copy(self.optimizer) if sharded else self.optimizer,
                            loss=loss, metrics=metrics, jit_compile=False, **kwargs)
        if sharded:
            self._sharding.shard_compiled(self.optimizer)   # built on this rank's share before the first step
        self._reductions.close()

    @property
    def loss_tracker(self) -> keras.metrics.Metric:
        """Keras's own loss metric (the first of `metrics`, named "loss")."""
        for metric in super().metrics:
            if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
                return metric
        if not hasattr(self, "_tnt_loss_tracker"):
            self._tnt_loss_tracker = keras.metrics.Mean(name="loss")
        return self._tnt_loss_tracker

    # --- steps ---------------------------------------------------------------

    @property
    def metrics(self):
        """Keras's list of metrics: the wrapped model's when it has its own training logic."""
        if getattr(self, "_own_logic", None):
            return self._model.metrics
        return super().metrics

    def train_step(self, data):
        if self._own_logic:
            return user_steps.train_step(self, data)
        virtual_batches = exact_train_step.virtual_batches_from_environment()
        if virtual_batches:  # tnt-repro's exact mode (Note [Exact mode] in tarantella/_repro/exact_reduction.py)
            return exact_train_step.train_step(self, data, virtual_batches)
        return tf_steps.train_step(self, data)

    def test_step(self, data):
        if self._own_logic:
            return user_steps.test_step(self, data)
        return tf_steps.test_step(self, data)

    def predict_step(self, data):
        if self._own_logic:
            return user_steps.predict_step(self, data)
        return tf_steps.predict_step(self, data)

    @property
    def metrics_ride_with_gradients(self) -> bool:
        """The train step sums the metric state in the gradient reduction
        (Note [Metric state rides with the gradients] in metric_reduction.py)."""
        return self._reductions.metrics_ride_with_gradients

    def reduce_gradients(self, gradients, variables):
        """Sum of every rank's gradients (called while tracing the train step)."""
        return self.reduce_gradients_and_metrics(gradients, variables)[0]

    def reduce_gradients_and_metrics(self, gradients, variables, metric_state=()):
        """(sum of every rank's gradients, sum of every rank's `metric_state` tensors), in one reduction
        (tarantella/step/step_reductions.py); call while tracing a train step."""
        to_owners = None
        if self.world_size > 1 and self._gathering is None:
            to_owners = sharding.reduction_to_owners(self.optimizer, variables)  # ZeRO stage 2, else None
        return self._reductions.gradients_and_metrics(gradients, variables, metric_state, to_owners, self._gathering)

    def statistics_allreduce(self, tensor: tf.Tensor) -> tf.Tensor:
        """The sum over the ranks of a small tensor a layer needs at once (BatchNormalization's statistics);
        call while tracing a step."""
        return self._reductions.statistics(tensor)

    def communication_profile(self) -> dict | None:
        """How the last train step's gradient allreduce overlapped backprop (see tarantella.timeline.overlap);
        None before the first step or on one rank."""
        return self._reductions.communication_profile()

    def get_metrics_result(self):
        """The metric values of all ranks together; a collective when called outside a step."""
        if self.world_size == 1 or self._metrics_local:
            return super().get_metrics_result()
        if tf.executing_eagerly():
            return metric_reduction.eager_global_results(self.metrics)
        return metric_reduction.graph_global_results(
            self.metrics, lambda tensors: self._reductions.allreducer_for(tensors, "metrics"))

    @contextlib.contextmanager
    def local_metric_results(self):
        """Within (while tracing a step): get_metrics_result gives this rank's values, no collective."""
        self._metrics_local = True
        try:
            yield
        finally:
            self._metrics_local = False

    # The step's reducers, as user_steps.py, tnt-repro, the benchmarks and the tests read them.
    def _allreducer_for(self, tensors, purpose: str):
        return self._reductions.allreducer_for(tensors, purpose)

    _allreducers = _reductions_attribute("allreducers")
    _gradient_allreducer = _reductions_attribute("gradient_allreducer")
    _metric_state_count = _reductions_attribute("metric_state_count")
    _metrics_ride = _reductions_attribute("metrics_ride")

    # --- fit / evaluate / predict -----------------------------------------------

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None, sample_weight=None,
            initial_epoch=0, steps_per_epoch=None, validation_steps=None, validation_batch_size=None,
            validation_freq=1, tnt_micro_batch_size=None, tnt_validation_micro_batch_size=None):
        """As keras.Model.fit; `batch_size` is the GLOBAL batch size (all ranks together).
        tnt_micro_batch_size: with an unbatched tf.data.Dataset, samples per rank and step."""
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = user_input.split_for_validation(
                x, y, sample_weight, validation_split)
        if class_weight and isinstance(x, tf.data.Dataset):
            x, class_weight = class_weights.with_class_weights(x, class_weight), None
        elif class_weight:
            sample_weight, class_weight = class_weights.array_sample_weights(y, sample_weight, class_weight), None
        seed, keras_order = serial_order.shared_shuffle()
        train = self._distribute(x, y, sample_weight, batch_size=batch_size, micro_batch_size=tnt_micro_batch_size,
                                 shuffle=shuffle if not isinstance(x, tf.data.Dataset) else False, seed=seed,
                                 keras_order=keras_order, class_weight=class_weight)
        validation = None
        if validation_data is not None:
            vx, vy, vsw, validation_batch_size = user_input.validation_parts(
                validation_data, validation_batch_size, batch_size, tnt_micro_batch_size,
                tnt_validation_micro_batch_size, self.world_size)
            validation = self._distribute(vx, vy, vsw, batch_size=validation_batch_size,
                                          micro_batch_size=tnt_validation_micro_batch_size,
                                          what="validation_batch_size")
        self._prepare(train)
        self._build_optimizer_before_the_step_is_traced()
        resume = fit_commits.prepare(self, train, initial_epoch, steps_per_epoch)  # None unless --elastic
        if resume is not None:
            train, initial_epoch = resume.dataset, resume.initial_epoch
        virtual_batches = exact_train_step.virtual_batches_from_environment()
        if virtual_batches:
            exact_train_step.prepare(virtual_batches, self.world_size, weights_sharded=self._gathering is not None,
                                     own_logic_of=type(self._model).__name__ if self._own_logic else None)
        # tnt-repro's recorder (only under `tnt-repro check`) runs on every rank.
        callbacks = (list(rank_callbacks.callbacks_for_this_rank(callbacks, collective_saves=self.is_sharded) or [])
                     + repro_hook.extra_callbacks())
        callbacks += order_check.callbacks(train=train, test=validation)  # collective, on every rank
        if resume is not None:
            callbacks = resume.attach(callbacks)
        if timeline.enabled():  # Note [Timeline span names]
            callbacks.append(step_events.TimelineCallback(self._reductions.timeline_allreducers))
        self._validation_dataset = validation
        if resume is not None:
            resume.install(self)
        try:
            return super().fit(train, epochs=epochs, verbose=rank_callbacks.verbosity_for_this_rank(verbose),
                               callbacks=callbacks,
                               validation_data=validation, shuffle=False, initial_epoch=initial_epoch,
                               steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                               validation_freq=validation_freq)
        finally:
            self._validation_dataset = None

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, tnt_micro_batch_size=None, **kwargs):
        """As keras.Model.evaluate, with the data sharded over the ranks; global results on every rank."""
        if x is not None and x is self._validation_dataset:  # fit's validation pass: already distributed
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
                                    steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs)
        data = self._distribute(x, y, sample_weight, batch_size=batch_size, micro_batch_size=tnt_micro_batch_size)
        self._prepare(data)
        return super().evaluate(data, verbose=rank_callbacks.verbosity_for_this_rank(verbose), steps=steps,
                                callbacks=list(rank_callbacks.callbacks_for_this_rank(callbacks) or [])
                                + order_check.callbacks(test=data),
                                return_dict=return_dict, **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None, tnt_micro_batch_size=None):
        """As keras.Model.predict: every rank predicts its part, every rank returns all predictions in input order."""
        data = self._distribute(x, None, None, batch_size=batch_size, micro_batch_size=tnt_micro_batch_size,
                                for_predict=True)
        self._prepare(data)
        predictions, positions = super().predict(data, verbose=rank_callbacks.verbosity_for_this_rank(verbose),
                                                 steps=steps,
                                                 callbacks=list(rank_callbacks.callbacks_for_this_rank(callbacks) or [])
                                                 + order_check.callbacks(predict=data))
        if self.world_size == 1:
            return predictions
        parts = collectives.allgather_object((predictions, positions))
        order = np.argsort(np.concatenate([part[1] for part in parts]), kind="stable")
        return tf.nest.map_structure(lambda *pieces: np.concatenate(pieces)[order], *[part[0] for part in parts])

    def _distribute(self, x, y, sample_weight, *, batch_size, micro_batch_size, shuffle=False, seed=0,
                    keras_order=False, class_weight=None, what="batch_size", for_predict=False):
        return user_input.distribute(x, y, sample_weight, batch_size=batch_size, micro_batch_size=micro_batch_size,
                                     shuffle=shuffle, seed=seed, keras_order=keras_order,
                                     class_weight=class_weight, size=self.world_size,
                                     rank=runtime.get_rank(), what=what, for_predict=for_predict)

    def _prepare(self, dataset: tf.data.Dataset) -> None:
        """Build the model (from one micro-batch) if needed, then give every rank the master's weights."""
        if self._own_logic:  # optimizers set after compile, perhaps
            self._distribute_own_optimizers()
        callable_model = type(self._model).call is not keras.Model.call or not self._own_logic
        if callable_model and (not self._model.built or not self.built):
            # From the element spec, not a real element: taking one would start an extra pass of the
            # pipeline (and move a seeded reshuffling on by an epoch).
            x, _, _ = keras.utils.unpack_x_y_sample_weight(dataset.element_spec[distributed_dataset.DATA])
            # Building must not move any state: a layer that draws even at inference (a VAE's Sampling) would
            # advance its SeedGenerator, and every later draw would differ from serial Keras's, which builds
            # inside the traced step. Keras's StatelessScope keeps every Keras variable as it was (new ones
            # are initialised on leaving it, as they would be outside).
            with keras.StatelessScope():
                self(tf.nest.map_structure(empty_micro_batch.sample_like, x), training=False)
        self._synchronize_weights()
        if self._sharding is not None and not self._own_logic and self.compiled and not self.optimizer.built:
            # Collectively, once per compile (Note [A sharded update] in tarantella/sharding/update.py)
            self._sharding.build_optimizer(self.optimizer, self.trainable_variables)

    def _build_optimizer_before_the_step_is_traced(self) -> None:
        """Keras's own train step applies the optimizer to the trainable variables (Note [The optimizer is built
        before the step is traced] in tarantella/step/optimizers.py)."""
        if not self._own_logic and self.compiled:
            optimizers.build_before_tracing(self.optimizer, self.trainable_variables)

    def _synchronize_weights(self) -> None:
        """Once, collectively: every rank starts from the master rank's weights (seeded or not)."""
        if self._weights_synchronized:
            return
        self._weights_synchronized = True
        if self.world_size > 1:
            initial_weights.take_from_master(self._model)


def _check_jit_compile(jit_compile) -> None:
    if jit_compile not in (False, "auto"):
        raise ValueError(f"tarantella: jit_compile={jit_compile!r} is not supported: the gradient allreduce "
                         f"ops are not XLA ops; use jit_compile=False or \"auto\" (both mean no XLA, at every "
                         f"rank count)")
