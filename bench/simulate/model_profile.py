"""The measured 1-device profile of a model: what the simulation needs to know about it.

    step_s, forward_s, backward_s, update_s   measured at `micro_batch` on this machine
    fixed_s, per_example_s   the step as fixed + per_example x batch (from forward plus
                 backward at the micro-batch and at half of it; the update counts as fixed)
    gradients    one entry per trainable variable, in the order backprop produces them
                 (last layer first): bytes and `ready_fraction`, the share of the
                 backward pass done when the gradient is complete
    step_times_s the 1-device run's timed steps (their spread: stragglers), `threads`
                 the cores it used
    batch_norm   one entry per BatchNormalization layer call, forward order: its channels
                 (the global statistics' allreduces per step follow from them)

Backprop is timed as a whole; its split over layers is estimated from each layer's
cost (2 x weights used x output positions, plus the elementwise work of every layer),
because timing single layers inside a compiled step is not possible without changing
it. A variable's gradient is complete when backprop passes the first layer that uses
it (a shared embedding: only at the very end).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

__all__ = ["layer_costs", "gradient_timeline", "batch_norm_layers", "measure_phases", "median_time",
           "fixed_and_per_example", "save_profile", "load_profile"]

_ELEMENTWISE_COST = 8.0   # flop-equivalents per output element for memory-bound work, fwd+bwd


def _layer_outputs(model):
    """[(layer, [symbolic outputs of all its calls])] in topological order."""
    found = []
    for layer in model.layers:
        if layer.__class__.__name__ == "InputLayer":
            continue
        outputs = []
        for node in getattr(layer, "_inbound_nodes", []):
            outputs.extend(node.output_tensors)
        found.append((layer, outputs))
    return found


def layer_costs(model, example_inputs) -> list[dict]:
    """Per layer: name, estimated cost of one example (flop-equivalents), variables used."""
    import keras
    found = _layer_outputs(model)
    tensors = [t for _, outputs in found for t in outputs]
    probe = keras.Model(model.inputs, tensors)
    values = probe(example_inputs, training=False)
    values = values if isinstance(values, (list, tuple)) else [values]
    shapes = iter([tuple(v.shape) for v in values])
    costs = []
    for layer, outputs in found:
        cost = 0.0
        weights = sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
        for _ in outputs:
            shape = next(shapes)
            positions = float(np.prod(shape[1:-1])) if len(shape) > 2 else 1.0
            elements = float(np.prod(shape[1:]))
            cost += 2.0 * weights * positions + _ELEMENTWISE_COST * elements
            if layer.__class__.__name__ == "MultiHeadAttention" and len(shape) == 3:
                cost += 4.0 * shape[1] * shape[1] * shape[2]   # scores and weighted sum
        costs.append({"layer": layer.name, "cost": cost,
                      "variables": [id(w) for w in layer.trainable_weights]})
    return costs


def gradient_timeline(model, example_inputs) -> list[dict]:
    """Gradients in the order backprop completes them, with bytes and ready_fraction."""
    costs = layer_costs(model, example_inputs)
    total = sum(c["cost"] for c in costs) or 1.0
    first_use = {}
    for index, entry in enumerate(costs):
        for var_id in entry["variables"]:
            first_use.setdefault(var_id, index)
    remaining_after = np.cumsum([c["cost"] for c in reversed(costs)])[::-1]  # cost of layers >= i
    timeline = []
    for variable in model.trainable_variables:
        index = first_use.get(id(variable), 0)
        timeline.append({"name": variable.path, "shape": list(variable.shape),
                         "bytes": int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize,
                         "layer": costs[index]["layer"],
                         "ready_fraction": float(remaining_after[index] / total)})
    timeline.sort(key=lambda g: (g["ready_fraction"], -_position(model, g["name"])))
    return timeline


def batch_norm_layers(model) -> list[dict]:
    """Per BatchNormalization call, in forward order: the layer and its channels (the product of the kept
    axes' sizes of its input)."""
    found = []
    for layer, outputs in _layer_outputs(model):
        if layer.__class__.__name__ != "BatchNormalization":
            continue
        for output in outputs:
            axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
            channels = int(np.prod([output.shape[axis] for axis in axes]))
            found.append({"layer": layer.name, "channels": channels})
    return found


def _position(model, path):
    for i, variable in enumerate(model.trainable_variables):
        if variable.path == path:
            return i
    return -1


def median_time(fn, repeats: int) -> float:
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_phases(model, loss_fn, inputs, labels, repeats: int = 3) -> dict:
    """Median seconds of the forward pass and of forward plus backward (no update), and
    forward plus backward on half the batch: the step's batch-independent part is
    what a line through the two batch sizes leaves at batch 0."""
    import tensorflow as tf

    @tf.function
    def forward(x, y):
        return loss_fn(y, model(x, training=True))

    @tf.function
    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    def run(fn, x, y):
        # an Embedding's gradient is tf.IndexedSlices: its values are what backprop computed
        return lambda: tf.nest.map_structure(
            lambda t: (t.values if isinstance(t, tf.IndexedSlices) else t).numpy(), fn(x, y))

    half = tf.nest.map_structure(lambda a: a[:max(len(a) // 2, 1)], (inputs, labels))
    forward_s = median_time(run(forward, inputs, labels), repeats)
    forward_backward_s = median_time(run(forward_backward, inputs, labels), repeats)
    half_s = median_time(run(forward_backward, *half), repeats)
    return {"forward_s": forward_s, "backward_s": max(forward_backward_s - forward_s, 0.0),
            "forward_backward_s": forward_backward_s, "forward_backward_half_s": half_s,
            "half_batch": int(len(half[1]))}


def fixed_and_per_example(phases: dict, batch: int, step_s: float) -> tuple[float, float]:
    """(fixed_s, per_example_s): the step at `batch` as fixed + per_example x batch, the per-example cost from
    forward plus backward at the batch and at half of it (measure_phases), at most their whole per example."""
    per_example_s = 0.0
    half = phases["half_batch"]
    if batch > half:
        per_example_s = max((phases["forward_backward_s"] - phases["forward_backward_half_s"]) / (batch - half), 0.0)
    per_example_s = min(per_example_s, phases["forward_backward_s"] / batch)
    return max(step_s - per_example_s * batch, 0.0), per_example_s


def save_profile(profile: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(profile, handle, indent=1, sort_keys=True)


def load_profile(path: str) -> dict:
    """The profile; one written before profiles kept their step times gets them from the
    1-device run of its sweep directory (runs.csv beside it), the run it was measured in."""
    with open(path, encoding="utf-8") as handle:
        profile = json.load(handle)
    if "step_times_s" not in profile:
        profile["step_times_s"] = _one_device_step_times(os.path.join(os.path.dirname(path), "runs.csv"))
    return profile


def _one_device_step_times(runs_csv: str) -> list[float]:
    import csv
    if not os.path.exists(runs_csv):
        return []
    with open(runs_csv, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get("devices") == "1" and row.get("simulated") in ("False", "false", "0"):
                return [float(t) for t in json.loads(row["step_times_s"])]
    return []
