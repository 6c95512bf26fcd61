"""A Keras model trained pipeline-parallel (and, optionally, data-parallel).

    model = make_pipelined_model(keras_model, num_micro_batches=4, schedule="1f1b")
    model.compile(optimizer, loss, metrics); model.fit(x, y, batch_size=GLOBAL_BATCH)

Each rank holds one stage (tarantella/pipelining/partition.py) of one replica
(topology.py); `fit`/`evaluate`/`predict` give every rank the same results as
the unpartitioned model on the same global batches (Note [Scaling the
micro-batch loss] in compiled_step.py). A step is one tf.function per rank:
its stage's whole schedule with in-graph transfers, the replica allreduce and
the optimizer update (compiled_step.py).

The rest lives beside it: the whole model's weights across the stages
(whole_model.py), what a step exchanges with the stage's replicas and the
replica's other stages (step_collectives.py, Note [One model across the
stages]), the step's logs (step_logs.py, Note [The logs travel in the step]),
the input (data.py). This class is the Keras face that calls them.

Note [When the update starts]
A variable's optimizer update needs only its summed gradient; TensorFlow
starts it once that exists (its reads in the passes come first: tf.function
orders the ops on one variable). Waiting for the end of the whole schedule
instead, as an earlier version did, held every gradient of the stage and the
update's temporaries at once. One wait is kept: a stage's last backward sends
its input gradients upstream, where the stage before waits for them, so its
updates wait for those sends (the first stage sends nothing upstream: its
updates run as soon as their gradients are final). Measured (8 x Dense(2048),
Adam, 2 stages, M = 8, batch 128, `tarantella -n 2`; bench/pipeline/program.py,
the variants built by hand for the comparison): the first stage's peak
growth 400-422 -> 367-379 MiB; without the kept wait, the last stage's too
(409-424 -> 374-375 MiB), but 8 x Dense(512) at batch 128 then trained 10-16 %
slower (3 pairs: 4389/3906, 4352/3931, 3660/3064 samples/s): the updates
compete with the backward that the stage before waits for. With deferred
weight gradients the updates can also run layer by layer inside the last
weight pass (Note [Updates in the weight pass] in updates_in_weight_pass.py).

Only public Keras extension points: a keras.Model subclass overriding
train/test/predict_step, get_metrics_result, fit/evaluate/predict (to build
global batches) and save.
"""
from __future__ import annotations

import contextlib
import logging
import time

import keras
import numpy as np
import tensorflow as tf

from tarantella import channels as peer_channels, collectives, runtime, stage_state
from tarantella._repro import exact_train_step
from tarantella.data import distributed_dataset, serial_order
from tarantella.elastic import commit_store
from tarantella.pipelining import data as pipeline_data
from tarantella.step import batch_position, global_batch_norm, optimizers, rank_callbacks, serial_random
from tarantella.step.adam_in_one_pass import adam_in_one_pass
from tarantella.pipelining.cut import choose_stages
from tarantella.pipelining.partition import graph_of, partition
from tarantella.pipelining.schedules import (FORWARD, Pass, check_micro_batches, deferred_schedule,
                                           schedule as make_schedule)
from tarantella.pipelining.compiled_step import MicroBatchData, StageStep
from tarantella.pipelining.stage_errors import naming_the_stage
from tarantella.pipelining.step_collectives import StepCollectives, check_shard
from tarantella.pipelining.step_logs import StepLogs
from tarantella.pipelining.topology import place
from tarantella.pipelining.updates_in_weight_pass import UpdatesInWeightPass, updates_in_weight_pass
from tarantella.pipelining.weight_gradients import weight_pass_every
from tarantella.pipelining.whole_model import WholeModel

try:
    from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn
except ImportError:  # pragma: no cover - a Keras release that moved it
    make_class_weight_map_fn = None

__all__ = ["PipelinedModel"]

logger = logging.getLogger("tarantella")


def default_micro_batches(num_stages: int) -> int:
    """4 micro-batches per stage: GPipe (Huang et al. 2019, sec. 2.2) finds the bubble negligible
    from M >= 4 S on; the bubble's share is (S-1)/(M+S-1), i.e. 1/9 for S = 2."""
    return 4 * num_stages


class _Untracked:
    """Holds the user's whole model without Keras tracking it as a sub-layer of the stage."""

    def __init__(self, model):
        self.model = model


class PipelinedModel(keras.Model):
    # What tnt-repro's records call this model's strategy.
    tnt_strategy = "pipelining (tnt.Model with parallel_strategy PIPELINING or ALL)"

    def __init__(self, model: keras.Model, *, num_micro_batches: int | None = None, schedule: str = "1f1b",
                 num_pipeline_stages: int | None = None, data_parallel: bool = False, balance_by: str = "time",
                 defer_weight_gradients: bool | int | None = None, name: str | None = None, shard_optimizer=None,
                 batch_norm: str = batch_position.GLOBAL_BATCH_NORM, shard: str | None = None):
        runtime.init()
        batch_position.check_batch_norm(batch_norm)
        check_shard(shard, shard_optimizer)
        if exact_train_step.virtual_batches_from_environment():
            raise ValueError("tarantella: exact mode (TNT_EXACT_VIRTUAL_BATCHES, tnt-repro --mode exact) splits the "
                             "data-parallel train step into virtual micro-batches; a pipeline sums its micro-batches' "
                             "gradients in schedule order, which exact mode does not cover: check a pipelined script "
                             "in tolerance mode")
        serial_random.install()
        global_batch_norm.install()
        graph = graph_of(model)
        size, rank = runtime.get_size(), runtime.get_rank()
        stage_of_op, num_stages = choose_stages(model, graph, num_pipeline_stages, size, data_parallel, balance_by)
        placement = place(rank, size, num_stages, data_parallel)
        self.partition = partition(model, graph, stage_of_op, num_stages, build_stage=placement.stage)
        if num_micro_batches is None:
            num_micro_batches = default_micro_batches(num_stages)
        make_schedule(schedule, num_micro_batches, num_stages, 0)  # validates the name and count
        if defer_weight_gradients is not None and not isinstance(defer_weight_gradients, bool) and not (
                isinstance(defer_weight_gradients, int) and defer_weight_gradients >= 1):
            raise ValueError(f"tarantella: defer_weight_gradients must be None, True, False or a number of "
                             f"micro-batches >= 1, got {defer_weight_gradients!r}")
        super().__init__(name=name or model.name)
        self.placement = placement
        self.num_micro_batches = int(num_micro_batches)
        self.schedule_name = schedule
        self.defer_weight_gradients = defer_weight_gradients
        self.stage_model = self.partition.stages[placement.stage].model
        self.output_names = list(model.output_names)
        self._user = _Untracked(model)
        self._whole = WholeModel(model, self.partition, placement)
        self._whole.check_same_partition()
        self._whole.start_weights()
        self._global_clipnorm = None
        self.shard = shard
        self._channels = peer_channels.open_channels() if num_stages > 1 else None
        self.runner = StageStep(self.partition, placement, self._channels)
        self._collectives = StepCollectives(placement, self.runner, shard_optimizer)
        self.batch_norm = self.runner.batch_norm = batch_norm
        if placement.num_replicas > 1:  # BatchNormalization over the stage's replicas (compiled_step.py)
            self.runner.statistics_allreduce = self._collectives.statistics_allreduce
        self._step_logs = StepLogs(placement, self.runner, self._collectives.stage_group)
        self._step_functions = {}
        self._schedules = {}              # per mode: this stage's passes
        # The step's `start` argument (compiled_step.py StageStep.build); one tensor, not one per step.
        self._start = tf.constant(0, tf.int32)
        self.built = True
        if runtime.is_master_rank():
            logger.info("tarantella: pipeline of %d stages x %d replicas, %d micro-batches, %s schedule\n%s",
                        num_stages, placement.num_replicas, self.num_micro_batches, schedule,
                        self.partition.describe())

    # --- the whole model -------------------------------------------------------------

    @property
    def whole_model(self) -> keras.Model:
        """The user's unpartitioned model. On this rank only its stage's weights hold values; the others are
        released (they read as zeros); get_weights() and save() gather them from their stages."""
        return self._user.model

    def sync_weights(self) -> list[np.ndarray]:
        """Collective: the whole model's current weights (every stage's), on every rank, as arrays."""
        return self._whole.sync_weights()

    def get_weights(self):
        """Collective: the whole model's weights, as the unpartitioned model's get_weights()."""
        return self._whole.sync_weights()

    def save(self, filepath, overwrite=True, **kwargs):
        """Collective: the master writes the whole model, with the optimizer's state of every stage,
        as one standard `.keras` file (tarantella.pipeline.load_model resumes from it)."""
        self._whole.save_gathered(lambda: self._user.model.save(filepath, overwrite=overwrite, **kwargs),
                                  self.optimizer, self.stage_model)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        self._whole.save_gathered(lambda: self._user.model.save_weights(filepath, overwrite=overwrite, **kwargs))

    def load_weights(self, filepath, *args, **kwargs):
        """Every rank reads the whole model's weights and keeps its stage's (scatter on load)."""
        self._whole.load_weights(filepath, *args, **kwargs)

    def adopt_optimizer_state(self, optimizer) -> None:
        """Take this stage's part of a whole model's optimizer state (a loaded `.keras` file's)."""
        if not self.optimizer.built:
            self.optimizer.build(self.stage_model.trainable_variables)
        stage_state.assign_by_name(stage_state.optimizer_state_by_name(self.optimizer),
                                   stage_state.optimizer_state_by_name(optimizer))

    def summary(self, *args, **kwargs):
        return self._user.model.summary(*args, **kwargs)

    # --- compile -----------------------------------------------------------------------

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, run_eagerly=None, jit_compile=False, **kwargs):
        """As keras.Model.compile. Keras calls train_step eagerly; the step itself is one
        tf.function (compiled_step.py), so run_eagerly does not apply."""
        if jit_compile not in (False, "auto", None):
            logger.warning("tarantella: jit_compile ignored for a pipelined model")
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, run_eagerly=True, jit_compile=False,
                        **kwargs)
        # The whole model is compiled alike, with its own (unbuilt) optimizer, so its saved file is complete.
        whole_optimizer = optimizers.unbuilt_copy(self.optimizer)
        self._user.model.compile(optimizer=whole_optimizer, loss=loss, metrics=metrics, **kwargs)
        self._step_functions = {}
        self._step_logs.forget_names()
        # Note [One model across the stages]: the norm for global_clipnorm is the whole model's.
        clipping = optimizers.unscaled_optimizer(self.optimizer)
        self._global_clipnorm = clipping.global_clipnorm if self.placement.num_stages > 1 else None
        if self._global_clipnorm:
            clipping.global_clipnorm = None
        if self.shard is not None:
            self._collectives.share_optimizer_state(self.optimizer)

    @property
    def loss_tracker(self) -> keras.metrics.Metric:
        for metric in self.metrics:
            if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
                return metric
        raise RuntimeError("tarantella: the model is not compiled")

    # --- symbolic and direct calls ------------------------------------------------------

    def call(self, inputs, training=None):
        """Symbolically (Keras building metrics): the whole model's output spec. Eagerly: the
        pipeline's prediction for one global batch, on every rank (a collective)."""
        if not tf.executing_eagerly():
            batch = tf.shape(keras.tree.flatten(inputs)[0])[0]
            outputs = [tf.zeros(tf.concat([[batch], t.shape[1:]], 0), t.dtype)
                       for t in keras.tree.flatten(self._user.model.output)]
            return keras.tree.pack_sequence_as(self._user.model.output, outputs)
        return self.predict_step((inputs,))

    # --- steps ---------------------------------------------------------------------------

    def _flat_inputs(self, x) -> list:
        specs = keras.tree.flatten(self._user.model.input)
        if isinstance(x, dict) and not isinstance(self._user.model.input, dict):
            return [x[t.name] for t in specs]
        flat = keras.tree.flatten(x)
        if len(flat) != len(specs):
            raise ValueError(f"tarantella: the model has {len(specs)} input(s) but the data has {len(flat)}")
        return flat

    def _step_function(self, mode: str):
        """The tf.function of a train, test or predict step (retraced per batch size)."""
        if mode not in self._step_functions:
            self._step_functions[mode] = tf.function(
                lambda inputs, targets, weights, start, global_size, is_part: self._traced_step(
                    mode, inputs, targets, weights, start, global_size, is_part))
        return self._step_functions[mode]

    def _traced_step(self, mode, *args):
        # Keras's Adam, to the bit, in one pass over each variable's arrays instead of ten elementwise ops:
        # a stage's update was most of its last weight pass (Note [Keras's Adam in one pass] in
        # csrc/tf/adam_update_op.cc).
        with adam_in_one_pass(self.optimizer) if mode == "train" else contextlib.nullcontext():
            return self._step_graph(mode, *args)

    def _run(self, data, mode: str):
        """Collective over the replica's stages: one step; returns the traced function's result.
        `data` is the global batch, or (from pipeline_data.replica_batches) the replica's part of it."""
        is_part = distributed_dataset.is_distributed_element(data)
        if is_part:
            global_size, data = int(data[distributed_dataset.GLOBAL_SIZE]), data[distributed_dataset.DATA]
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if not is_part:
            global_size = int(keras.tree.flatten(x if x is not None else y)[0].shape[0])
        check_micro_batches(global_size, self.placement.num_replicas, self.num_micro_batches)
        inputs = self._flat_inputs(x) if self.placement.is_first_stage else None
        last = self.placement.is_last_stage
        if mode == "train" and not self.optimizer.built:
            self.optimizer.build(self.stage_model.trainable_variables)
        began = time.time()
        try:
            result = self._step_function(mode)(inputs, y if last else None, sample_weight if last else None,
                                                self._start, global_size, is_part)
        except tf.errors.OpError as error:
            raise naming_the_stage(error, self.placement) from None
        self.runner.record(self._passes(mode, global_size), result["times"], began, time.time())
        return result

    def _passes(self, mode: str, global_size: int) -> list[Pass]:
        key = mode if mode != "train" else (mode, global_size)  # 1F1B's default for deferring depends on rows
        if key not in self._schedules:
            if mode != "train":
                self._schedules[key] = [Pass(FORWARD, m) for m in range(self.num_micro_batches)]
            else:
                rows = -(-global_size // self.placement.num_replicas)  # the largest part: every replica alike
                every = weight_pass_every(self.defer_weight_gradients, self.schedule_name, self.stage_model, rows,
                                          self.num_micro_batches)
                if every and self.runner.defers_weight_gradients:
                    passes = deferred_schedule(self.schedule_name, self.num_micro_batches,
                                               self.placement.num_stages, self.placement.stage, every,
                                               fill_drain=not self._updates_in_weight_pass())
                else:
                    passes = make_schedule(self.schedule_name, self.num_micro_batches, self.placement.num_stages,
                                           self.placement.stage)
                self._schedules[key] = passes
        return self._schedules[key]

    def _updates_in_weight_pass(self) -> bool:
        """Note [Updates in the weight pass] in updates_in_weight_pass.py."""
        return updates_in_weight_pass(self.optimizer, self.placement.num_replicas,
                                      self._collectives.decides_across_stages(self.optimizer, self._global_clipnorm))

    def _step_graph(self, mode, inputs, targets, weights, start, global_size: int, is_part: bool = False):
        """Traced: this rank's whole step (Note [The schedule inside one graph] in compiled_step.py)."""
        training = mode == "train"
        first, count = pipeline_data.replica_part(global_size, self.placement.num_replicas, self.placement.replica)
        offset = 0 if is_part else first  # the input is already this replica's part
        part = lambda tree: None if tree is None else keras.tree.map_structure(  # noqa: E731
            lambda t: t[offset:offset + count], tree)
        sizes = tuple(b - a for a, b in pipeline_data.micro_batch_bounds(count, self.num_micro_batches))
        data = MicroBatchData(part(inputs), part(targets), part(weights), sizes, first=first, global_size=global_size)

        def scale_penalty(m, value):
            return self.optimizer.scale_loss(value * tf.cast(sizes[m] / global_size, value.dtype))

        def last_stage_loss(m, flat_pred, y_m, sw_m, n_m):
            if y_m is None:
                return None
            y_pred = keras.tree.pack_sequence_as(self._user.model.output, flat_pred)
            loss = self.compute_loss(x=None, y=y_m, y_pred=y_pred, sample_weight=sw_m, training=training)
            self.loss_tracker.update_state(loss, sample_weight=n_m)
            self.compute_metrics(None, y_m, y_pred, sample_weight=sw_m)
            if not training:
                return None
            share = tf.cast(n_m / global_size, loss.dtype)  # Note [Scaling the micro-batch loss]
            return self.optimizer.scale_loss(loss * share)

        across_stages = training and self._collectives.decides_across_stages(self.optimizer, self._global_clipnorm)
        updates = UpdatesInWeightPass(self.optimizer) if training and self._updates_in_weight_pass() else None
        predictions, gradients, tokens, times, penalty = self.runner.build(
            self._passes(mode, global_size), data, start, last_stage_loss, training, scale_penalty, updates)
        result = {"times": times}
        variables = self.stage_model.trainable_variables
        if training:
            gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
            gradients = self._collectives.sum_over_replicas(gradients)
        if mode != "predict":
            tokens += self._collectives.add_layer_losses_of_earlier_stages(penalty, start, self.loss_tracker)
            if across_stages:
                gradients = self._collectives.decide_across_stages(gradients, start, self.optimizer,
                                                                   self._global_clipnorm)
            logs, sent_logs = self._step_logs.in_graph(mode, start, self.metrics)
            result["logs"] = logs
            tokens += sent_logs
        result["sent"] = tf.add_n(tokens) if tokens else tf.constant(0)
        if training:
            # Note [When the update starts]
            with tf.control_dependencies(self.runner.last_upstream_sends):
                if updates is not None:   # Note [Updates in the weight pass] in updates_in_weight_pass.py
                    updates.finish(gradients, variables)
                else:
                    self.optimizer.apply(gradients, variables)
        if mode == "predict" and predictions:
            outputs = len(next(iter(predictions.values())))
            result["predictions"] = [tf.concat([predictions[m][i] for m in sorted(predictions)], 0)
                                     for i in range(outputs)]
        return result

    def train_step(self, data):
        return self._step_logs.publish(self._run(data, "train")["logs"], "train", self.metrics)

    def test_step(self, data):
        return self._step_logs.publish(self._run(data, "test")["logs"], "test", self.metrics)

    def predict_step(self, data):
        if distributed_dataset.is_distributed_element(data):
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data[distributed_dataset.DATA])
            data = {**data, distributed_dataset.DATA: (x,)}
        else:
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            data = (x,)
        result = self._run(data, "predict")
        mine = None
        if self.placement.is_last_stage and "predictions" in result:
            mine = [p.numpy() for p in result["predictions"]]
        parts = collectives.allgather_object(mine) if runtime.get_size() > 1 else [mine]
        last = [parts[self.placement.rank_of(r, self.placement.num_stages - 1)]
                for r in range(self.placement.num_replicas)]
        flat = [np.concatenate([part[i] for part in last if part is not None])
                for i in range(len(keras.tree.flatten(self._user.model.output)))]
        return keras.tree.pack_sequence_as(self._user.model.output, flat)

    @property
    def _gradient_allreducer(self):
        """The stage's gradient reducer over its replicas (None before the first train step or with one
        replica): what the benchmarks read the buckets' times from."""
        return self._collectives.gradient_allreducer

    # --- logs --------------------------------------------------------------------------------

    def get_metrics_result(self):
        if self._step_logs.latest is None:
            return super().get_metrics_result()
        return dict(self._step_logs.latest)

    def reset_metrics(self):
        super().reset_metrics()
        self._step_logs.latest = None

    # --- fit / evaluate / predict ------------------------------------------------------------

    def _replica_input(self) -> dict:
        """Where this rank reads (tarantella/pipelining/data.py replica_batches)."""
        return dict(num_replicas=self.placement.num_replicas, replica=self.placement.replica,
                    first_stage=self.placement.is_first_stage, last_stage=self.placement.is_last_stage)

    def _check_batches(self, x, batch_size) -> None:
        pipeline_data.check_batches(x, batch_size, self.placement.num_replicas, self.num_micro_batches)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1):
        """As keras.Model.fit; `batch_size` is the GLOBAL batch size, cut into num_micro_batches per replica."""
        if commit_store.directory() is not None:   # refused, rather than a new generation training from scratch
            raise ValueError("tarantella --elastic: a pipelined model (SplitLayer, more than one rank) is not "
                             "committed yet; run it without --elastic, or data parallel without SplitLayer")
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = pipeline_data.split_for_validation(
                x, y, sample_weight, validation_split)
        seed, keras_order = serial_order.shared_shuffle()
        self._check_batches(x, batch_size)
        if validation_data is not None and not isinstance(validation_data, tf.data.Dataset):
            self._check_batches(validation_data[0], validation_batch_size or batch_size)
        # As Keras: per-sample weights from the class of each target (single-output models).
        train = pipeline_data.replica_batches(x, y, sample_weight, batch_size=batch_size,
                                              shuffle=shuffle if not isinstance(x, tf.data.Dataset) else False,
                                              seed=seed, keras_order=keras_order,
                                              batch_map=(make_class_weight_map_fn(class_weight) if class_weight
                                                         else None),
                                              **self._replica_input())
        validation = None if validation_data is None else pipeline_data.validation_batches(
            validation_data, validation_batch_size or batch_size, **self._replica_input())
        return super().fit(train, epochs=epochs, verbose=rank_callbacks.verbosity_for_this_rank(verbose),
                           callbacks=rank_callbacks.callbacks_for_this_rank(callbacks), validation_data=validation,
                           shuffle=False, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                           validation_steps=validation_steps, validation_freq=validation_freq)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, **kwargs):
        self._check_batches(x, batch_size)
        data = pipeline_data.replica_batches(x, y, sample_weight, batch_size=batch_size, **self._replica_input())
        return super().evaluate(data, verbose=rank_callbacks.verbosity_for_this_rank(verbose), steps=steps,
                                callbacks=rank_callbacks.callbacks_for_this_rank(callbacks), return_dict=return_dict,
                                **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        self._check_batches(x, batch_size)
        data = pipeline_data.replica_batches(x, batch_size=batch_size, **self._replica_input())
        return super().predict(data, verbose=rank_callbacks.verbosity_for_this_rank(verbose), steps=steps,
                               callbacks=rank_callbacks.callbacks_for_this_rank(callbacks))
