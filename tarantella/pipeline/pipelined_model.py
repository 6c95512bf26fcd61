"""A Keras model trained pipeline-parallel (and, optionally, data-parallel).

    model = make_pipelined_model(keras_model, num_micro_batches=4, schedule="1f1b")
    model.compile(optimizer, loss, metrics); model.fit(x, y, batch_size=GLOBAL_BATCH)

Each rank holds one stage (tarantella/pipeline/partition.py) of one replica
(topology.py); `fit`/`evaluate`/`predict` give every rank the same results as
the unpartitioned model on the same global batches (Note [Scaling the
micro-batch loss] in compiled_step.py). A step is one tf.function per rank:
its stage's whole schedule with in-graph transfers, the replica allreduce and
the optimizer update (compiled_step.py).

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
takes the Python broadcast of the last stage's logs (`_broadcast_logs`).

Only public Keras extension points: a keras.Model subclass overriding
train/test/predict_step, get_metrics_result, fit/evaluate/predict (to build
global batches) and save.
"""
from __future__ import annotations

import logging
import time

import keras
import numpy as np
import tensorflow as tf

from tarantella import collectives, runtime
from tarantella._repro import exact_train_step
from tarantella.data import distributed_dataset, serial_order
from tarantella.keras.blocking_allreduce import BlockingAllreduce
from tarantella.keras.graph_allreduce import GraphAllreducer
from tarantella.keras import batch_position, global_batch_norm, serial_random
from tarantella.keras import callbacks as rank_callbacks
from tarantella.keras.metric_reduction import graph_global_results, metric_variables, results_from_state
from tarantella.pipeline import channels as peer_channels
from tarantella.pipeline import data as pipeline_data
from tarantella.pipeline import stage_state
from tarantella.pipeline.cut import choose_stages
from tarantella.pipeline.partition import graph_of, partition
from tarantella.pipeline.schedules import (FORWARD, Pass, check_micro_batches, deferred_schedule,
                                           schedule as make_schedule)
from tarantella.pipeline.compiled_step import LAYER_LOSSES_TAG, LOGS_TAG, MicroBatchData, StageStep
from tarantella.pipeline.topology import place

try:
    from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn
except ImportError:  # pragma: no cover - a Keras release that moved it
    make_class_weight_map_fn = None

__all__ = ["PipelinedModel"]

logger = logging.getLogger("tarantella")

LOG_SLOTS = 32   # scalar logs carried in the step (Note [The logs travel in the step])


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
                 defer_weight_gradients: bool | int | None = None, name: str | None = None,
                 batch_norm: str = batch_position.GLOBAL_BATCH_NORM):
        runtime.init()
        batch_position.check_batch_norm(batch_norm)
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
        self._check_same_partition()
        self._broadcast_initial_weights()
        self._release_other_stages()
        self._stage_group = collectives.Group.world().split(placement.stage) if size > 1 else None
        # The stages of this rank's replica: one decision per step for the whole model (Note [One model
        # across the stages]).
        self._pipeline_group = collectives.Group.world().split(placement.replica) if num_stages > 1 else None
        self._pipeline_allreducer = None
        self._global_clipnorm = None
        self._channels = peer_channels.open_channels() if num_stages > 1 else None
        self.runner = StageStep(self.partition, placement, self._channels)
        self.batch_norm = self.runner.batch_norm = batch_norm
        if placement.num_replicas > 1:  # BatchNormalization over the stage's replicas (compiled_step.py)
            self.runner.statistics_allreduce = self._statistics_allreduce
        self._statistics_allreducer = None
        self._gradient_allreducer = None
        self._step_functions = {}
        self._metric_allreducers = {}
        self._schedules = {}              # per mode: this stage's passes
        # The step's `start` argument (compiled_step.py StageStep.build); one tensor, not one per step.
        self._start = tf.constant(0, tf.int32)
        self._log_keys, self._traced_log_keys = {}, {}   # per mode: the logs' names (Note [The logs travel in the step])
        self._global_logs = None
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

    def _check_same_partition(self) -> None:
        """Collective: every rank must cut the same model the same way (edge ids are message tags)."""
        if runtime.get_size() == 1:
            return
        mine = [(e.source, e.target, e.shape, e.dtype) for e in self.partition.edges]
        everyone = collectives.allgather_object(mine)
        differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
        if differ:
            raise ValueError(f"tarantella: ranks {differ} cut the model differently from rank 0 "
                             f"(rank 0: {everyone[0]}; rank {differ[0]}: {everyone[differ[0]]}); every rank must "
                             f"build the same model with the same SplitLayers")

    def _stage_variables(self, stage: int) -> list:
        """Variables of `stage`, known on every rank: the weights of the layers the stage runs."""
        names = set(self.partition.stages[stage].layer_names)
        return [w for op in self._user.model.operations if op.name in names for w in getattr(op, "weights", [])]

    def _owner_ranks(self) -> list[int]:
        """Per variable of the whole model (in model.weights order): the rank of replica 0 holding it."""
        owner = {id(v): s for s in range(self.placement.num_stages) for v in self._stage_variables(s)}
        return [self.placement.rank_of(0, owner.get(id(v), 0)) for v in self._user.model.weights]

    def _release_other_stages(self) -> None:
        """Keep only this stage's weights (Note [Releasing a variable] in stage_state.py)."""
        if self.placement.num_stages == 1:
            return
        mine = {id(v) for v in self._stage_variables(self.placement.stage)}
        for variable in self._user.model.weights:
            if id(variable) not in mine:
                stage_state.release(variable)

    def _broadcast_initial_weights(self) -> None:
        """Collective: every rank starts from the master's weights (all ranks hold the whole model at this point)."""
        if runtime.get_size() == 1:
            return
        model = self._user.model
        model.set_weights([collectives.broadcast(np.array(w, copy=True), root=runtime.get_master_rank())
                           for w in model.get_weights()])

    def sync_weights(self) -> list[np.ndarray]:
        """Collective: the whole model's current weights (every stage's), on every rank, as arrays."""
        weights, owners, rank = self._user.model.weights, self._owner_ranks(), runtime.get_rank()
        if runtime.get_size() == 1:
            return [np.array(v.numpy()) for v in weights]
        values = []
        for variable, owner in zip(weights, owners):
            buffer = (np.array(variable.numpy(), copy=True) if rank == owner
                      else np.empty(tuple(variable.shape), variable.dtype))
            values.append(collectives.broadcast(buffer, root=owner))
        return values

    def get_weights(self):
        """Collective: the whole model's weights, as the unpartitioned model's get_weights()."""
        return self.sync_weights()

    def _gather_on_master(self, with_optimizer: bool) -> list:
        """Collective: the master's whole model (and, with_optimizer, the whole model's optimizer) get
        every stage's current state; returns the variables given storage for it, to release after."""
        model, master, rank = self._user.model, runtime.get_master_rank(), runtime.get_rank()
        weights, owners = model.weights, self._owner_ranks()
        keys = list(range(len(weights)))
        specs = {k: (tuple(v.shape), v.dtype) for k, v in enumerate(weights)}
        gathered = stage_state.gather_to_root({k: v.numpy() for k, v in enumerate(weights) if owners[k] == rank},
                                              keys, specs, dict(enumerate(owners)), master, rank)
        materialized = []
        if rank == master:
            for k, variable in enumerate(weights):
                if stage_state.is_released(variable):
                    materialized.append(variable)
                stage_state.materialize(variable, gathered[k])
        if with_optimizer and self.optimizer is not None:
            materialized += self._gather_optimizer_on_master()
        return materialized

    def _gather_optimizer_on_master(self) -> list:
        if not self.optimizer.built:
            self.optimizer.build(self.stage_model.trainable_variables)
        mine = stage_state.optimizer_state_by_name(self.optimizer)
        infos = collectives.allgather_object({n: (tuple(v.shape), v.dtype) for n, v in mine.items()})
        owner, specs = {}, {}
        for r, info in enumerate(infos):       # replica 0's ranks come first
            for name, spec in info.items():
                owner.setdefault(name, r)
                specs.setdefault(name, spec)
        names = sorted(owner)
        master, rank = runtime.get_master_rank(), runtime.get_rank()
        gathered = stage_state.gather_to_root({n: v.numpy() for n, v in mine.items() if owner[n] == rank}, names,
                                              specs, owner, master, rank)
        if rank != master:
            return []
        whole = self._user.model.optimizer
        if not whole.built:
            whole.build(self._user.model.trainable_variables)
        state = stage_state.optimizer_state_by_name(whole)
        stage_state.assign_by_name(state, gathered)
        return list(state.values())

    def _save_gathered(self, write, with_optimizer: bool) -> None:
        """Collective: the master writes the whole model with `write` (gather on save)."""
        if runtime.get_size() == 1:
            write()
            return
        materialized = self._gather_on_master(with_optimizer)
        try:
            if runtime.is_master_rank():
                write()
        finally:
            for variable in materialized:
                stage_state.release(variable)
            collectives.barrier()

    def save(self, filepath, overwrite=True, **kwargs):
        """Collective: the master writes the whole model, with the optimizer's state of every stage,
        as one standard `.keras` file (tarantella.pipeline.load_model resumes from it)."""
        self._save_gathered(lambda: self._user.model.save(filepath, overwrite=overwrite, **kwargs), True)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        self._save_gathered(lambda: self._user.model.save_weights(filepath, overwrite=overwrite, **kwargs), False)

    def load_weights(self, filepath, *args, **kwargs):
        """Every rank reads the whole model's weights and keeps its stage's (scatter on load)."""
        for variable in self._user.model.weights:
            if stage_state.is_released(variable):
                stage_state.materialize(variable, np.zeros(tuple(variable.shape), variable.dtype))
        self._user.model.load_weights(filepath, *args, **kwargs)
        self._release_other_stages()

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
        whole_optimizer = self.optimizer.__class__.from_config(self.optimizer.get_config())
        self._user.model.compile(optimizer=whole_optimizer, loss=loss, metrics=metrics, **kwargs)
        self._step_functions = {}
        self._log_keys, self._traced_log_keys = {}, {}
        # Note [One model across the stages]: the norm for global_clipnorm is the whole model's.
        clipping = self._unscaled_optimizer()
        self._global_clipnorm = clipping.global_clipnorm if self.placement.num_stages > 1 else None
        if self._global_clipnorm:
            clipping.global_clipnorm = None

    def _unscaled_optimizer(self):
        """The optimizer that applies the (unscaled) gradients: a LossScaleOptimizer's inner one."""
        return getattr(self.optimizer, "inner_optimizer", self.optimizer)

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
                lambda inputs, targets, weights, start, global_size, is_part: self._step_graph(
                    mode, inputs, targets, weights, start, global_size, is_part))
        return self._step_functions[mode]

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
        result = self._step_function(mode)(inputs, y if last else None, sample_weight if last else None,
                                            self._start, global_size, is_part)
        self.runner.record(self._passes(mode), result["times"], began, time.time())
        return result

    def _passes(self, mode: str) -> list[Pass]:
        if mode not in self._schedules:
            if mode != "train":
                self._schedules[mode] = [Pass(FORWARD, m) for m in range(self.num_micro_batches)]
            else:
                every = self._weight_pass_every()
                if every and self.runner.defers_weight_gradients:
                    passes = deferred_schedule(self.schedule_name, self.num_micro_batches,
                                               self.placement.num_stages, self.placement.stage, every)
                else:
                    passes = make_schedule(self.schedule_name, self.num_micro_batches, self.placement.num_stages,
                                           self.placement.stage)
                self._schedules[mode] = passes
        return self._schedules[mode]

    def _weight_pass_every(self) -> int | None:
        """Micro-batches per weight pass (Note [Deferred weight gradients] in weight_gradients.py); None:
        each backward accumulates its own weight gradients. True: one weight pass after the last backward
        (all of a step's micro-batches in one product per layer). The default (None) is True for GPipe,
        which holds every micro-batch's activations anyway, and False for 1F1B, whose point is to hold at
        most S - stage micro-batches (deferring would hold the layer inputs of all of them)."""
        defer = self.defer_weight_gradients
        if defer is None:
            defer = self.schedule_name == "gpipe"
        if defer is False:
            return None
        if defer is True:
            return self.num_micro_batches
        return int(defer)

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

        predictions, gradients, tokens, times, penalty = self.runner.build(
            self._passes(mode), data, start, last_stage_loss, training, scale_penalty)
        result = {"times": times}
        variables = self.stage_model.trainable_variables
        if training:
            gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
            gradients = self._sum_over_replicas(gradients)
        if mode != "predict":
            tokens += self._add_layer_losses_of_earlier_stages(penalty, start)
            if training and self._decides_across_stages():
                gradients = self._decide_across_stages(gradients, start)
            logs, sent_logs = self._logs_in_graph(mode, start)
            result["logs"] = logs
            tokens += sent_logs
        result["sent"] = tf.add_n(tokens) if tokens else tf.constant(0)
        if training:
            # Not after the sends: they read activations and their gradients, never the weights, and the last
            # stage's last sends complete only when the other stages have taken them (the step still ends
            # only once they have; "sent" is one of its results).
            # But after the last pass: otherwise TensorFlow starts a variable's update as soon as its summed
            # gradient exists, inside the last backward, which then takes ~1.5 ms longer (Adam, 8 x Dense(512),
            # M = 8) while the stage before waits for its gradient (1F1B, 2 pinned stages: step 40.5-41.6 ->
            # 39.5-40.4 ms).
            with tf.control_dependencies([times]):
                self.optimizer.apply(gradients, variables)
        if mode == "predict" and predictions:
            outputs = len(next(iter(predictions.values())))
            result["predictions"] = [tf.concat([predictions[m][i] for m in sorted(predictions)], 0)
                                     for i in range(outputs)]
        return result

    def train_step(self, data):
        return self._publish_logs(self._run(data, "train"), "train")

    def test_step(self, data):
        return self._publish_logs(self._run(data, "test"), "test")

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

    def _add_layer_losses_of_earlier_stages(self, penalty, start) -> list:
        """Traced (Note [One model across the stages]): each earlier stage sends the size-weighted sum of its
        layers' losses to the last stage of its replica, which adds them to the logged loss. One way, and
        available after the earlier stage's last forward: no stage waits for another's end of step.
        Returns the send tokens."""
        if self._pipeline_group is None:
            return []
        last = self.placement.num_stages - 1
        if not self.placement.is_last_stage:
            # `start` keeps the value from being a constant (graph optimisation must not run a transfer).
            value = tf.cast(penalty, tf.float64) + tf.cast(start, tf.float64) * 0.0
            return [self.runner.send_control(value, last, LAYER_LOSSES_TAG)]
        received = [self.runner.receive_control(start, (), tf.float64, s, LAYER_LOSSES_TAG) for s in range(last)]
        total = self.loss_tracker.total
        total.assign_add(tf.cast(tf.add_n(received), total.dtype))
        return []

    def _decides_across_stages(self) -> bool:
        """Whether the update needs the whole model's gradients' norm (global_clipnorm) or its finiteness
        (a LossScaleOptimizer's one decision): then the stages of a replica meet at the end of the step."""
        return self._pipeline_group is not None and bool(
            self._global_clipnorm or hasattr(self.optimizer, "inner_optimizer"))

    def _decide_across_stages(self, gradients, start):
        """Traced, collective over the replica's stages (Note [One model across the stages]): the gradients
        get the whole model's global_clipnorm and, under a LossScaleOptimizer, its one decision to skip the step."""
        squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in gradients]) if gradients \
            else tf.constant(0.0, tf.float64)
        # `start` (a function argument) keeps the value from being a constant: graph optimisation would fold a
        # constant-input start op instead of running it every step.
        local = tf.reshape(squares + tf.cast(start, tf.float64) * 0.0, [1])
        if self._pipeline_allreducer is None:
            self._pipeline_allreducer = GraphAllreducer([local.shape], [local.dtype], group=self._pipeline_group)
        total_squares = self._pipeline_allreducer([local])[0][0]
        if not gradients:
            return gradients
        if self._global_clipnorm:
            norm = tf.sqrt(total_squares)
            if hasattr(self.optimizer, "inner_optimizer"):
                norm = norm / tf.cast(self.optimizer.scale_loss(tf.constant(1.0)), tf.float64)
            clip = tf.constant(self._global_clipnorm, tf.float64)
            # As Keras's clip_by_global_norm: scale by clip / max(norm, clip); NaN if the norm is not finite.
            factor = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            gradients = [g * tf.cast(factor, g.dtype) for g in gradients]
        if hasattr(self.optimizer, "inner_optimizer"):
            # Every stage's LossScaleOptimizer sees non-finite gradients if any stage has them.
            poison = tf.where(tf.math.is_finite(total_squares), 0.0, float("nan"))
            gradients = [g + tf.cast(poison, g.dtype) for g in gradients]
        return gradients

    def _statistics_allreduce(self, tensor):
        """The sum over this stage's replicas of a small tensor a layer needs at once (BatchNormalization's
        statistics); the allreducer is made collectively in the stage's group when first traced."""
        if self._statistics_allreducer is None:
            self._statistics_allreducer = BlockingAllreduce(group=self._stage_group)
        return self._statistics_allreducer(tensor)

    def _sum_over_replicas(self, gradients):
        """Traced: the sum over the stage's replicas, through the fused reducer's graph ops."""
        if self.placement.num_replicas == 1 or not gradients:
            return gradients
        if self._gradient_allreducer is None:
            # Registered in backprop order (the reverse of the variables), as data parallelism does.
            backward = gradients[::-1]
            self._gradient_allreducer = GraphAllreducer([g.shape for g in backward], [g.dtype for g in backward],
                                                        group=self._stage_group)
        return self._gradient_allreducer(gradients[::-1])[::-1]

    # --- logs ------------------------------------------------------------------------------

    def _logs_in_graph(self, mode: str, start):
        """Traced (Note [The logs travel in the step]): the step's logs as a float64 vector on every stage of
        the replica, and the tokens of the last stage's sends."""
        last = self.placement.num_stages - 1
        if not self.placement.is_last_stage:
            return self.runner.receive_control(start, (LOG_SLOTS + 1,), tf.float64, last, LOGS_TAG), []
        results = graph_global_results(self.metrics, self._metric_allreducer)
        keys = list(results)
        values = [tf.convert_to_tensor(results[k]) for k in keys]
        if len(keys) <= LOG_SLOTS and all(v.shape.rank == 0 and (v.dtype.is_floating or v.dtype.is_integer)
                                          for v in values):
            self._traced_log_keys[mode] = keys
            vector = tf.concat([tf.constant([len(keys)], tf.float64), tf.stack([tf.cast(v, tf.float64) for v in values])
                                if values else tf.zeros([0], tf.float64), tf.zeros([LOG_SLOTS - len(keys)], tf.float64)], 0)
        else:
            self._traced_log_keys[mode] = None
            vector = tf.concat([[-1.0], tf.zeros([LOG_SLOTS], tf.float64)], 0)
        vector = vector + tf.cast(start, tf.float64) * 0.0   # not a constant (as in _add_layer_losses_...)
        sends = [self.runner.send_control(vector, s, LOGS_TAG) for s in range(last)]
        return vector, sends

    def _metric_allreducer(self, tensors):
        """The sum of the last stages' metric states over the replicas (in the stage's group)."""
        if self.placement.num_replicas == 1:
            return lambda values: values
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if key not in self._metric_allreducers:
            self._metric_allreducers[key] = GraphAllreducer([t.shape for t in tensors], [t.dtype for t in tensors],
                                                            group=self._stage_group)
        return self._metric_allreducers[key]

    def _publish_logs(self, result, mode: str) -> dict:
        """The step's logs, the same on every rank (Note [The logs travel in the step]); collective the first
        time after compile per mode (the logs' names), and whenever the logs do not fit the vector."""
        vector = np.asarray(result["logs"])
        if mode not in self._log_keys:
            keys = self._traced_log_keys.get(mode) if self.placement.is_last_stage else None
            if runtime.get_size() > 1:
                keys = collectives.broadcast_object(keys, root=self.placement.rank_of(0, self.placement.num_stages - 1))
            self._log_keys[mode] = keys
        keys = self._log_keys[mode]
        if vector[0] >= 0 and keys is not None:
            logs = {k: float(v) for k, v in zip(keys, vector[1:1 + int(vector[0])])}
        else:
            logs = self._broadcast_logs()
        self._global_logs = logs
        return dict(logs)

    def _broadcast_logs(self) -> dict:
        """Collective: the last stage's logs, as Python objects (logs the vector cannot carry)."""
        logs = None
        if self.placement.is_last_stage:
            values = [np.asarray(v.numpy()) for v in metric_variables(self.metrics)]
            if self.placement.num_replicas > 1:
                values = [collectives.allreduce(v, group=self._stage_group) if v.size else v for v in values]
            results = results_from_state(self.metrics, [tf.convert_to_tensor(v) for v in values])
            logs = {k: float(v) if np.ndim(v) == 0 else np.asarray(v) for k, v in results.items()}
        if runtime.get_size() > 1:
            logs = collectives.broadcast_object(logs, root=self.placement.rank_of(0, self.placement.num_stages - 1))
        return logs

    def get_metrics_result(self):
        if self._global_logs is None:
            return super().get_metrics_result()
        return dict(self._global_logs)

    def reset_metrics(self):
        super().reset_metrics()
        self._global_logs = None

    # --- fit / evaluate / predict ------------------------------------------------------------

    def _replica_input(self) -> dict:
        """Where this rank reads (tarantella/pipeline/data.py replica_batches)."""
        return dict(num_replicas=self.placement.num_replicas, replica=self.placement.replica,
                    first_stage=self.placement.is_first_stage, last_stage=self.placement.is_last_stage)

    def _check_batches(self, x, batch_size) -> None:
        """Before training: arrays cut into global batches (the last one possibly smaller) that the
        replicas' micro-batches must divide; a dataset's batches are checked at each step."""
        if x is None or isinstance(x, tf.data.Dataset):
            return
        count = len(keras.tree.flatten(x)[0])
        size = pipeline_data.DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
        for batch in {min(size, count), count % size} - {0}:
            check_micro_batches(batch, self.placement.num_replicas, self.num_micro_batches)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1):
        """As keras.Model.fit; `batch_size` is the GLOBAL batch size, cut into num_micro_batches per replica."""
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
                                              batch_map=make_class_weight_map_fn(class_weight) if class_weight else None,
                                              **self._replica_input())
        validation = None
        if validation_data is not None:
            vx, vy, vsw = (keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
                           if isinstance(validation_data, (tuple, list)) else (validation_data, None, None))
            validation = pipeline_data.replica_batches(
                vx, vy, vsw, batch_size=None if isinstance(vx, tf.data.Dataset) else (validation_batch_size or batch_size),
                **self._replica_input())
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
