"""Train/test/predict steps of a tnt.Model whose wrapped model brings its own training logic.

A model that overrides `train_step`, `test_step`, `predict_step`, `compute_loss`
or `compute_metrics` (keras.io "Customizing what happens in fit()", a GAN) keeps
them: tnt.Model calls the wrapped model's own step on this rank's micro-batch.
Gradients are reduced inside the optimizer (Note [Distributing through the
optimizer] in distributed_optimizer.py), metric state is summed over the ranks
(metric_reduction.py), and an empty micro-batch never reaches the layers
(Note [Empty micro-batches] in empty_micro_batch.py).

What the logs become: a value that is the result of one of the model's
metrics (`model.metrics`), i.e. a tensor its `result()` returned during the
step, is the global result, from the summed state; any other float scalar the
step returns is taken as a mean over the micro-batch and becomes the global
batch's mean (sum over ranks of value * n_r / N), in its own dtype. A log's key
plays no part: Keras itself reports the step's logs whenever their keys differ
from its metrics' (`Trainer._get_metrics_result_or_logs`), so a step that
returns its own `loss` beside other values reports that loss, not the (never
updated) loss tracker's (Note [Which log values are metric results]).

Note [Which log values are metric results]
Serial Keras logs what the step returns. A value the step computed itself (a
loss over the batch) is serial's when the ranks' values are averaged by their
shares; a metric's result is serial's only when computed from the metric state
summed over the ranks. The two cannot be told apart by name: keras.io's steps
return `{"loss": loss, ...}` beside Keras's own loss tracker, also named
"loss", which such a step never updates. So while the step is traced, each
metric's `result()` is watched, and a returned tensor that one of them
produced is replaced by that metric's global result; everything else is a
mean.

Note [Means of whole micro-batches]
A `keras.metrics.Mean` updated with one scalar and no sample weight
(`self.loss_tracker.update_state(loss)`, the keras.io pattern) counts the
scalar once per step. Serial Keras counts the global batch's mean once; summed
as they are, the ranks' states would count every micro-batch's mean once (the
mean of the means: serial's only for equal micro-batches). So during a step,
such an update gets the sample weight n_r / N * ranks: the summed state then
adds ranks * (the global batch's mean) to the total and `ranks` to the count,
whose ratio over the steps is serial's. An empty micro-batch weighs 0.
Updates with sample weights or per-sample values are left alone (summed, they
are already serial's).
"""
from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from tarantella.step import batch_position, empty_micro_batch, metric_reduction, serial_random, tf_steps
from tarantella.keras.distributed_optimizer import StepContext, step_context

__all__ = ["OVERRIDABLE", "overridden", "train_step", "test_step", "predict_step"]

OVERRIDABLE = ("train_step", "test_step", "predict_step", "compute_loss", "compute_metrics")


def overridden(model: keras.Model) -> list[str]:
    """The training-logic methods `model`'s class defines itself (not Keras's)."""
    return [name for name in OVERRIDABLE
            if getattr(type(model), name, None) is not getattr(keras.Model, name)]


def _share(count, global_size) -> tf.Tensor:
    """n_r / N in float64, cast to each tensor's dtype where it weighs one: a float32 share of a float64 model's
    gradient (2/5, say) would round it to float32's precision; for float32 tensors the cast gives the very bits of
    a float32 division (both are correctly rounded)."""
    return tf.cast(count, tf.float64) / tf.cast(global_size, tf.float64)


def _state_to_keep(model) -> list:
    user = model.wrapped_model
    return empty_micro_batch.state_to_keep(user, metric_reduction.metric_variables(user.metrics), model.batch_norm)


def train_step(model, data):
    user = model.wrapped_model
    batch, global_size, _ = tf_steps.unpack(data, model.world_size)
    batch, count, may_be_empty = empty_micro_batch.with_placeholder(batch)
    share = _share(count, global_size)
    restorer = empty_micro_batch.Restorer(_state_to_keep(model), may_be_empty)
    context = StepContext(share=share, allreducer_for=model._allreducer_for,
                          overlap=model.overlap_communication)
    gathering = model._gathering   # shard="weights": Note [Weights gathered for a model's own train_step]
    with step_context(context), _whole_batch_means(user.metrics, share * model.world_size), \
            _watching_results(user.metrics) as produced, \
            batch_position.tracing_step(batch_position.of_step(model, batch, global_size, count)), \
            gathering.tapes_sum_on_owners(share) if gathering is not None else contextlib.nullcontext():
        logs = user.train_step(batch)
    serial_random.warn_unrecognised(tf.compat.v1.get_default_graph())
    if context.applies == 0:  # refused at every rank count, so a 1-rank trial already says so
        raise ValueError(f"tarantella: {type(user).__name__}.train_step updated no variables through "
                         f"optimizer.apply/apply_gradients, so its gradients cannot be summed over the ranks; "
                         f"apply gradients with one of the model's optimizers (or use tnt.reduce_gradients in a "
                         f"custom loop)")
    model._gradient_allreducer = context.first_allreducer
    restorer.restore_if_empty(count)
    return global_logs(model, logs, share, produced)


def test_step(model, data):
    user = model.wrapped_model
    batch, global_size, _ = tf_steps.unpack(data, model.world_size)
    batch, count, may_be_empty = empty_micro_batch.with_placeholder(batch)
    restorer = empty_micro_batch.Restorer(_state_to_keep(model), may_be_empty)
    share = _share(count, global_size)
    with _whole_batch_means(user.metrics, share * model.world_size), _watching_results(user.metrics) as produced, \
            batch_position.tracing_step(batch_position.of_step(model, batch, global_size, count)):
        logs = user.test_step(batch)
    restorer.restore_if_empty(count)
    return global_logs(model, logs, share, produced)


def predict_step(model, data):
    user = model.wrapped_model
    batch, global_size, first_index = tf_steps.unpack(data, model.world_size)
    run, count, _ = empty_micro_batch.with_placeholder(batch)
    with batch_position.tracing_step(batch_position.of_step(model, run, global_size, count)):
        predictions = tf.nest.map_structure(lambda tensor: tensor[:count], user.predict_step(run))
    return tf_steps.with_positions(data, predictions, first_index, count)


@contextlib.contextmanager
def _whole_batch_means(metrics, weight):
    """Within (while tracing a step): Mean metrics updated with one scalar and no sample weight count it with
    `weight` (Note [Means of whole micro-batches]). The metrics' own update_state is back afterwards."""
    wrapped = []
    for metric in metrics:
        # Mean's own update_state(values, sample_weight) only: a subclass with its own (MeanMetricWrapper's
        # update_state(y_true, y_pred), as MeanAbsoluteError) averages per-sample values, already serial's.
        if (isinstance(metric, keras.metrics.Mean) and type(metric).update_state is keras.metrics.Mean.update_state
                and "update_state" not in vars(metric)):
            def update_state(values, sample_weight=None, _original=metric.update_state):
                if sample_weight is None and tf.convert_to_tensor(values).shape.rank == 0:
                    sample_weight = weight
                return _original(values, sample_weight=sample_weight)
            metric.update_state = update_state
            wrapped.append(metric)
    try:
        yield
    finally:
        for metric in wrapped:
            del metric.update_state


def global_logs(model, logs, share, produced: dict):
    """The step's logs with global values (see the module docstring); local on one rank. `produced` maps
    id(tensor) to the key of the metric result that tensor is (_watching_results)."""
    if model.world_size == 1 or not isinstance(logs, dict):
        return logs
    values = tf.nest.flatten(logs)
    results = {}
    if any(id(value) in produced for value in values):
        results = metric_reduction.graph_global_results(
            model.wrapped_model.metrics, lambda tensors: model._allreducer_for(tensors, "metrics"))
    means = [value for value in values if id(value) not in produced and _is_float_scalar(value)]
    summed = {}
    if means:
        weighted = [value * tf.cast(share, value.dtype) for value in means]
        summed = dict(zip(map(id, means), model._allreducer_for(weighted, "logs")(weighted)))

    def global_value(value):
        if id(value) in produced and produced[id(value)] in results:
            return results[produced[id(value)]]
        return summed.get(id(value), value)
    return tf.nest.pack_sequence_as(logs, [global_value(value) for value in values])


@contextlib.contextmanager
def _watching_results(metrics):
    """Within (while tracing a step): yields {id(tensor): result key} of every tensor a metric's `result()`
    returned, keyed as metric_reduction.results_from_state keys the global results (Note [Which log values
    are metric results]). The metrics' own result is back afterwards."""
    produced, alive = {}, []   # `alive` holds the tensors, so that no other object takes their ids
    watched = list({id(metric): metric for metric in metrics}.values())
    for metric in watched:
        def result(_original=metric.result, _name=metric.name):
            value = _original()
            named = value.items() if isinstance(value, dict) else [(_name, value)]
            for key, item in named:
                produced[id(item)] = key
                alive.append(item)
            return value
        metric.result = result
    try:
        yield produced
    finally:
        for metric in watched:
            del metric.result


def _is_float_scalar(value) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) and value.dtype.is_floating and value.shape.rank == 0
