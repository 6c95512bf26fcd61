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
import logging
import os

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, deferred_build, runtime, sharding, stage_state, timeline
from tarantella._repro import exact_train_step
from tarantella._repro import hook as repro_hook
from tarantella.data import distributed_dataset, order_check, serial_order, user_input
from tarantella.keras import class_weights, distributed_optimizer, models, user_steps
from tarantella.keras.parallel_strategy import ParallelStrategy
from tarantella.sharding import checkpoint as sharding_checkpoint, gathered_weights
from tarantella.step import (batch_position, empty_micro_batch, global_batch_norm, gradient_reduction,
                             metric_reduction, optimizers, rank_callbacks, serial_random, tf_steps)
from tarantella.step.graph_allreduce import GraphAllreducer
from tarantella.step.in_graph_sum import InGraphSum
from tarantella.timeline import overlap, step_events

__all__ = ["Model"]

logger = logging.getLogger("tarantella")


_PIPELINING_ARGUMENTS = ("num_micro_batches", "schedule", "num_pipeline_stages", "balance_by",
                         "defer_weight_gradients")


def _log_one_rank_pipeline(arguments: dict) -> None:
    """Note [A pipelined model on one rank]
    A pipelining script started on one rank (a serial run, tnt-repro's serial reference, a laptop) has no
    ranks to put stages on: tnt.Model trains the whole model as serial Keras does (the data-parallel model
    on one rank), ignoring the SplitLayers (identities) and the pipeline's arguments, and says so once.
    What the pipeline would do differently is its BatchNormalization per micro-batch (Note [A pipeline's
    micro-batches and the layers that look at the batch]); everything else is serial training."""
    unknown = set(arguments) - set(_PIPELINING_ARGUMENTS)
    if unknown:
        raise TypeError(f"tarantella: tnt.Model got unexpected arguments {sorted(unknown)}")
    logger.info("tarantella: 1 rank: pipelining needs a rank per stage; training the whole model serially "
                "(ignoring %s)", ", ".join(f"{k}={v!r}" for k, v in arguments.items()) or "the SplitLayers")


class Model(keras.Model):
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
    replicas share its optimizer state] in tarantella/pipeline/step_collectives.py); stages 2-3 not."""

    # What tnt-repro's records call this model's strategy (read there without importing this module).
    tnt_strategy = "data parallel (tnt.Model)"

    def __new__(cls, model=None, parallel_strategy=ParallelStrategy.DATA, *args, **kwargs):
        """PIPELINING and ALL give the pipelined model (tarantella.pipeline), which
        takes num_micro_batches, schedule and num_pipeline_stages."""
        if isinstance(parallel_strategy, ParallelStrategy) and ParallelStrategy.PIPELINING in parallel_strategy:
            if isinstance(model, keras.Model) and user_steps.overridden(model):
                raise ValueError(f"tarantella: pipelining cuts the model into stages and runs its own schedule, so "
                                 f"{type(model).__name__}'s {', '.join(user_steps.overridden(model))} cannot be kept; "
                                 f"use ParallelStrategy.DATA for a model with its own training logic")
            shard = sharding.resolve_mode(kwargs.pop("shard", None))
            if runtime.get_size() == 1:  # Note [A pipelined model on one rank]
                _log_one_rank_pipeline(kwargs)
                return super().__new__(cls)
            from tarantella.pipeline import make_pipelined_model
            return make_pipelined_model(model, data_parallel=parallel_strategy == ParallelStrategy.ALL,
                                        shard=shard, **kwargs)
        return super().__new__(cls)

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
        self._statistics_allreducer: InGraphSum | None = None
        self._model = model
        self.parallel_strategy = parallel_strategy
        self.overlap_communication = overlap_communication
        self.world_size = runtime.get_size()
        self.shard = shard
        self._loaded_optimizer = None     # a built optimizer handed to compile: its state, for the sharded one
        self._master_restores_for_all = False
        self._restored_wholes = []   # own training logic: (optimizer, whole) the master restored for all
        self._allreducers: list[tuple[str, GraphAllreducer]] = []  # (purpose, allreducer)
        self._gradient_allreducer: GraphAllreducer | None = None
        self._metric_state_count = 0  # metric tensors riding at the end of the gradient allreducer
        # Note [Metric state rides with the gradients]; False (tests, measurements): a separate reduction after them
        self._metrics_ride = True
        self._validation_dataset = None
        self._weights_synchronized = False
        self._metrics_local = False
        # Note [A model's own training logic]
        self._own_logic = user_steps.overridden(model)
        self._gathering = None   # shard="weights": Note [Weights gathered layer by layer]
        if shard == "weights" and self.world_size > 1:
            self._gathering = self._shard_weights(model)
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

    # --- the wrapped model ---------------------------------------------------

    def build(self, input_shape=None):
        self.built = True  # the wrapped model builds itself on its first call

    def call(self, inputs, training=None):
        return self._model(inputs, training=training)

    @property
    def wrapped_model(self) -> keras.Model:
        """The user's Keras model (shares its variables with this one)."""
        return self._model

    @property
    def layers(self):
        return self._model.layers

    def get_layer(self, name=None, index=None):
        return self._model.get_layer(name=name, index=index)

    @property
    def inputs(self):
        return self._model.inputs

    @property
    def outputs(self):
        return self._model.outputs

    def summary(self, *args, **kwargs):
        return self._model.summary(*args, **kwargs)

    def get_weights(self):
        """The wrapped model's weights; with shard="weights" a collective (each weight comes from its owner)."""
        if self._gathering is not None:
            return self._gathering.whole_weights(self._model.weights)
        return self._model.get_weights()

    def set_weights(self, weights):
        """With shard="weights" each rank keeps the values of the weights it owns."""
        if self._gathering is None:
            self._model.set_weights(weights)
            return
        for variable, value in zip(self._model.weights, weights):
            if not stage_state.is_released(variable):
                variable.assign(value)

    def to_json(self, **kwargs):
        return self._model.to_json(**kwargs)

    def save(self, filepath, overwrite=True, **kwargs):
        """The master rank writes the wrapped model as a plain `.keras` file; other ranks do nothing
        (every rank writes with --output-on-all-devices, like the output callbacks). Not a collective,
        except with shard="optimizer": then every rank must call it, the master gathers every rank's optimizer
        state and writes the file alone. Load it with keras.saving.load_model or tnt.models.load_model."""
        if self._saves_sharded():  # Note [Saving and restoring sharded optimizer state]
            with self._whole_weights_on_master(), self._gathered_optimizer_state() as writes:
                if writes:
                    self._write(filepath, overwrite, **kwargs)
            return
        if not rank_callbacks.output_on_this_rank():
            return
        self._write(filepath, overwrite, **kwargs)

    def _saves_sharded(self) -> bool:
        """Whether saving gathers every rank's optimizer state on the master (a collective)."""
        return self._sharded_update is not None or (self._own_logic and self._is_sharded())

    def _whole_weights_on_master(self):
        """shard="weights": the master holds every weight while it writes them (a collective)."""
        if self._gathering is None:
            return contextlib.nullcontext()
        return self._gathering.whole_on(runtime.get_master_rank())

    def _shard_weights(self, model):
        self._weights_synchronized = True   # every rank takes its own weights from the master's (below)
        return gathered_weights.shard_weights(model, runtime.get_rank(), self.world_size)

    def _gathered_optimizer_state(self):
        if self._own_logic:   # Note [Saving a model with its own training logic, sharded]
            return sharding_checkpoint.own_optimizers_gathered_on_master(self._model)
        return sharding_checkpoint.gathered_on_master(self.optimizer, self._sharded_update.owned,
                                                      self._model.optimizer, self._model.trainable_variables)

    def _write(self, filepath, overwrite, save=None, **kwargs) -> None:
        """The wrapped model's `save` (or save_weights) to `filepath`."""
        save = save or self._model.save
        path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
        suffix = next((s for s in (".keras", ".weights.h5") if path is not None and path.endswith(s)), None)
        if suffix is None or not overwrite:
            save(filepath, overwrite=overwrite, **kwargs)
            return
        # Written aside, then renamed: ranks writing one path together (with --output-on-all-devices; HDF5 would
        # refuse the second writer's lock), and readers, never see half a file.
        directory, name = os.path.split(os.path.abspath(path))
        scratch = os.path.join(directory, f".{name}.rank{runtime.get_rank()}.tmp{suffix}")
        save(scratch, overwrite=True, **kwargs)
        os.replace(scratch, path)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """As save: the master writes (every rank with --output-on-all-devices); with shard="optimizer" a
        collective, the master writes alone."""
        if self._saves_sharded():
            with self._whole_weights_on_master(), self._gathered_optimizer_state() as writes:
                if writes:
                    self._write(filepath, overwrite, save=self._model.save_weights, **kwargs)
            return
        if rank_callbacks.output_on_this_rank():
            self._write(filepath, overwrite, save=self._model.save_weights, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        """Not a collective. With shard="optimizer" each rank that reads the file keeps its own share of the
        optimizer state (Note [Saving and restoring sharded optimizer state])."""
        if not self._saves_sharded():
            self._model.load_weights(filepath, *args, **kwargs)
            return
        if self._gathering is not None:   # the file holds every weight; this rank keeps its own (below)
            self._gathering.hold_all()
        if self._own_logic:   # Note [Saving a model with its own training logic, sharded]
            pairs = sharding_checkpoint.read_own_whole(self._model,
                                                       lambda: self._model.load_weights(filepath, *args, **kwargs))
            if self._master_restores_for_all:
                self._restored_wholes = pairs
                return
            for optimizer, whole in pairs:
                sharding_checkpoint.take_share(optimizer, whole)
                sharding_checkpoint.release(whole)
            self.release_unowned_weights()
            return
        sharding_checkpoint.prepare_to_load(self._model.optimizer, self._model.trainable_variables)
        self._model.load_weights(filepath, *args, **kwargs)
        sharding_checkpoint.take_share(self.optimizer, self._model.optimizer)
        if not self._master_restores_for_all:
            sharding_checkpoint.release(self._model.optimizer)
            self.release_unowned_weights()

    def release_unowned_weights(self) -> None:
        """shard="weights": give back the storage of the weights this rank does not own (after a load)."""
        if self._gathering is not None:
            self._gathering.release_unowned()

    @property
    def is_sharded(self) -> bool:
        """Whether this rank keeps only its share of the optimizer state (shard=..., set up by fit; a model with its
        own training logic: its optimizers, once built)."""
        return self._saves_sharded()

    @contextlib.contextmanager
    def master_restores_for_all(self):
        """Within, on the master: a restored file's whole optimizer state is kept until
        `share_restored_optimizer_state` (a collective, after) hands every rank its share."""
        self._master_restores_for_all = True
        try:
            yield
        finally:
            self._master_restores_for_all = False

    def share_restored_optimizer_state(self) -> None:
        """Collective: every rank's share of the master's restored optimizer state (BackupAndRestore)."""
        if not self._own_logic:
            sharding_checkpoint.share_from_master(self.optimizer, self._model.optimizer,
                                                  self._model.trainable_variables)
            return
        restored, self._restored_wholes = dict((id(o), w) for o, w in self._restored_wholes), []
        for optimizer in sharding_checkpoint.built_sharded_optimizers(self._model):   # every rank alike
            sharding_checkpoint.share_from_master(optimizer, restored.get(id(optimizer)),
                                                  sharding.sharding_of(optimizer).variables)

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
        if self._is_sharded():   # a loaded model's optimizers hold the whole state: each rank takes its share
            sharding_checkpoint.take_share_when_built(self._model)
        super().compile(optimizer=self._model.optimizer or "rmsprop", jit_compile=False)
        self._distribute_own_optimizers()
        self._close_allreducers()

    def _distribute_own_optimizers(self) -> None:
        """The wrapped model's optimizers reduce their gradients, sharded with shard="optimizer" (the sharded apply
        below the reduction)."""
        for optimizer in optimizers.optimizers_of(self._model):
            if self._is_sharded():
                sharding.shard_optimizer(optimizer, mode=self.shard)
            distributed_optimizer.distribute_optimizer(optimizer)

    def _compile_direct(self, optimizer="rmsprop", loss=None, metrics=None, **kwargs):
        _check_loss_reduction(loss)
        sharded = self._is_sharded()
        if sharded and isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
            # A loaded model's optimizer holds every variable's state: the sharded one is a new copy, built on this
            # rank's variables, that takes this rank's part of that state at the first fit.
            self._loaded_optimizer, optimizer = optimizer, optimizers.unbuilt_copy(optimizer)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=False, **kwargs)
        # The wrapped model is compiled alike so that its saved file is complete: sharing the optimizer, or, when
        # sharded, with an unbuilt copy that gets every rank's state only to be saved (save()).
        self._model.compile(optimizer=optimizers.unbuilt_copy(self.optimizer) if sharded else self.optimizer,
                            loss=loss, metrics=metrics, jit_compile=False, **kwargs)
        if sharded:
            # built on this rank's share before the first step (_prepare)
            sharding.shard_model_optimizer(self.optimizer, mode=self.shard)
        self._close_allreducers()

    def _is_sharded(self) -> bool:
        return bool(self.shard) and self.world_size > 1

    @property
    def _sharded_update(self):
        """The sharding of the optimizer of the direct path once it is built (Note [A sharded update])."""
        if self._own_logic or not self._is_sharded():
            return None
        return sharding.sharding_of(getattr(self, "optimizer", None))

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
        if virtual_batches and self._gathering is not None:
            raise ValueError("tarantella: tnt-repro's exact mode does not run shard='weights' (it reduces whole "
                             "gradients by virtual batches); check the script with shard='gradients'")
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
        return self.world_size > 1 and self._metrics_ride

    def reduce_gradients(self, gradients, variables):
        """Sum of every rank's gradients (called while tracing the train step)."""
        return self.reduce_gradients_and_metrics(gradients, variables)[0]

    def reduce_gradients_and_metrics(self, gradients, variables, metric_state=()):
        """(sum of every rank's gradients, sum of every rank's `metric_state` tensors), in one reduction
        (Note [Metric state rides with the gradients] in metric_reduction.py); call while tracing a train step."""
        metric_state = list(metric_state)
        if self.world_size == 1:
            return gradients, metric_state

        def allreducer_for(tensors):
            self._gradient_allreducer = self._allreducer_for(tensors, "gradients")
            self._metric_state_count = len(metric_state)
            return self._gradient_allreducer

        if self._gathering is not None:  # summed on the owners in backprop (Note [Weights gathered layer by layer])
            summed_state = self._allreducer_for(metric_state, "metrics")(metric_state) if metric_state else []
            return self._gathering.marked(gradients), summed_state
        riding = metric_reduction.RidingAllreducer(allreducer_for, metric_state)
        to_owners = sharding.reduction_to_owners(self.optimizer, variables)  # ZeRO stage 2, else None
        reduced = gradient_reduction.weighted_sum(gradients, variables, None, riding, self.overlap_communication,
                                                  to_owners)
        summed_state = riding.summed_state
        if summed_state is None:  # no dense gradient to ride with
            summed_state = self._allreducer_for(metric_state, "metrics")(metric_state) if metric_state else []
        return reduced, summed_state

    def statistics_allreduce(self, tensor: tf.Tensor) -> tf.Tensor:
        """The sum over the ranks of a small tensor a layer needs at once (BatchNormalization's statistics);
        call while tracing a step. The allreducer is made collectively on first use (every rank traces the
        same layers in the same order)."""
        if self._statistics_allreducer is None:
            self._statistics_allreducer = InGraphSum()
        return self._statistics_allreducer(tensor)

    def communication_profile(self) -> dict | None:
        """How the last train step's gradient allreduce overlapped backprop (see tarantella.timeline.overlap);
        None before the first step or on one rank."""
        if self._gradient_allreducer is None:
            return None
        profile = overlap.communication_profile(self._gradient_allreducer.last_step_times())
        profile["bucket_bytes"] = self._gradient_allreducer.bucket_bytes()
        return profile

    def get_metrics_result(self):
        """The metric values of all ranks together; a collective when called outside a step."""
        if self.world_size == 1 or self._metrics_local:
            return super().get_metrics_result()
        if tf.executing_eagerly():
            return metric_reduction.eager_global_results(self.metrics)
        return metric_reduction.graph_global_results(
            self.metrics, lambda tensors: self._allreducer_for(tensors, "metrics"))

    @contextlib.contextmanager
    def local_metric_results(self):
        """Within (while tracing a step): get_metrics_result gives this rank's values, no collective."""
        self._metrics_local = True
        try:
            yield
        finally:
            self._metrics_local = False

    def _allreducer_for(self, tensors, purpose: str) -> GraphAllreducer:
        """One reducer per purpose and tensor list, reused by every traced step (train, test, retraces).
        Created collectively: every rank traces the same steps in the same order."""
        for known_purpose, allreducer in self._allreducers:
            if known_purpose == purpose and allreducer.matches(tensors):
                return allreducer
        allreducer = GraphAllreducer([t.shape for t in tensors], [t.dtype for t in tensors])
        self._allreducers.append((purpose, allreducer))
        return allreducer

    def _timeline_allreducers(self) -> list:
        """(purpose, allreducer) pairs for the timeline: the metric buckets riding in the gradient reducer
        count as the metrics' (Note [Metric state rides with the gradients])."""
        pairs = list(self._allreducers)
        if self._gradient_allreducer is not None and self._metric_state_count:
            pairs.append(("metrics", metric_reduction.MetricBuckets(self._gradient_allreducer,
                                                                    self._metric_state_count)))
        return pairs

    def _close_allreducers(self):
        for _, allreducer in self._allreducers:
            allreducer.close()
        self._allreducers = []
        self._gradient_allreducer = None
        self._metric_state_count = 0

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
            vx, vy, vsw = (keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
                           if isinstance(validation_data, (tuple, list)) else (validation_data, None, None))
            if isinstance(vx, tf.data.Dataset):
                validation_batch_size = None
            else:
                validation_batch_size = validation_batch_size or (None if tnt_validation_micro_batch_size
                                                                  else batch_size)
                if validation_batch_size is None and tnt_validation_micro_batch_size is None:
                    validation_batch_size = (tnt_micro_batch_size * self.world_size
                                             if tnt_micro_batch_size else None)
            validation = self._distribute(vx, vy, vsw, batch_size=validation_batch_size,
                                          micro_batch_size=tnt_validation_micro_batch_size,
                                          what="validation_batch_size")
        self._prepare(train)
        self._build_optimizer_before_the_step_is_traced()
        virtual_batches = exact_train_step.virtual_batches_from_environment()
        if virtual_batches and self._own_logic:
            raise ValueError(f"tarantella exact mode splits tnt.Model's own train step into virtual micro-batches, "
                             f"so {type(self._model).__name__}'s own training logic cannot run in it; check this "
                             f"model in tolerance mode (`tnt-repro check --mode tolerance`)")
        if virtual_batches:
            exact_train_step.prepare(virtual_batches, self.world_size)
        # tnt-repro's recorder (only under `tnt-repro check`) runs on every rank.
        callbacks = (list(rank_callbacks.callbacks_for_this_rank(callbacks, collective_saves=self.is_sharded) or [])
                     + repro_hook.extra_callbacks())
        callbacks += order_check.callbacks(train=train, test=validation)  # collective, on every rank
        if timeline.enabled():  # Note [Timeline span names]
            callbacks.append(step_events.TimelineCallback(self._timeline_allreducers))
        self._validation_dataset = validation
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
        if self._is_sharded() and not self._own_logic and self.compiled and not self.optimizer.built:
            self._build_sharded_optimizer()

    def _build_optimizer_before_the_step_is_traced(self) -> None:
        """Keras's own train step applies the optimizer to the trainable variables (Note [The optimizer is built
        before the step is traced] in tarantella/step/optimizers.py)."""
        if not self._own_logic and self.compiled:
            optimizers.build_before_tracing(self.optimizer, self.trainable_variables)

    def _build_sharded_optimizer(self) -> None:
        """Collectively, once per compile: build the optimizer on this rank's share of the variables (Note [A
        sharded update] in tarantella/sharding/update.py), taking that share of a loaded model's state."""
        self.optimizer.build(self.trainable_variables)
        if self._loaded_optimizer is not None:
            sharding_checkpoint.take_share(self.optimizer, self._loaded_optimizer)
            self._loaded_optimizer = None

    def _synchronize_weights(self) -> None:
        """Once, collectively: every rank starts from the master rank's weights (seeded or not)."""
        if self._weights_synchronized:
            return
        self._weights_synchronized = True
        if self.world_size == 1:
            return
        root = runtime.get_master_rank()
        self._model.set_weights([collectives.broadcast(np.array(weight, copy=True), root=root)
                                 for weight in self._model.get_weights()])
        # The random layers' seed states too: serial-equal draws need the master's seeds on every rank
        # (Note [Random values by sample, not by rank] in serial_random.py).
        weights = {id(weight) for weight in self._model.weights}
        for variable in self._model.variables:
            if id(variable) not in weights:
                variable.assign(collectives.broadcast(np.array(variable.numpy(), copy=True), root=root))


def _check_jit_compile(jit_compile) -> None:
    if jit_compile not in (False, "auto"):
        raise ValueError(f"tarantella: jit_compile={jit_compile!r} is not supported: the gradient allreduce "
                         f"ops are not XLA ops; use jit_compile=False or \"auto\" (both mean no XLA, at every "
                         f"rank count)")


def _check_loss_reduction(loss) -> None:
    """Note [Loss of the global batch] needs losses that are means over the batch."""
    for item in tf.nest.flatten(loss):
        reduction = getattr(item, "reduction", None)
        if reduction in ("sum", "mean_with_sample_weight"):
            raise ValueError(f"tarantella: loss {getattr(item, 'name', item)!r} has reduction={reduction!r}; "
                             f"distributed training weights each rank's loss by its share of the global batch, "
                             f"which needs a mean over the batch: use reduction=\"sum_over_batch_size\"")
