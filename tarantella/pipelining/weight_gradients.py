"""Deferred weight gradients: a stage's Dense layers compute their weight
gradients once for several micro-batches instead of once per micro-batch.

Note [Deferred weight gradients]
A backward pass computes two things: the gradients of the stage's inputs (the
next stage upstream waits for them) and the gradients of the stage's weights
(nobody waits for them before the update). Accumulated per micro-batch, the
weight gradients cost, besides their products, one pass over the stage's
weights per micro-batch: each micro-batch's weight-sized gradient is written,
then read again and added into the sum (memory-bound on a CPU; at small
micro-batches it costs more than the products themselves). For a Dense layer
y = act(x W + b) the sum over micro-batches is
    dW = sum_m x_m^T dz_m = X^T dZ,   db = sum over the rows of dZ,
with dz_m = dy_m * act'(z_m) and X, dZ the micro-batches' rows stacked: one
product over all of them, no weight-sized adds. So, as zero-bubble pipelining's
split of a backward into B and W (Qi et al. 2023), a stage's backward pass
(B) computes only the input gradients and keeps each Dense layer's x_m and
dz_m; a weight pass (W, schedules.with_weight_passes) computes X^T dZ for the
micro-batches whose B passes ran since the last W pass. The B pass is then
shorter, and so is the time the other stages wait for it, the more so as it
takes its input gradients in the faster form of Note [The input gradient as
kernel dz^T] below.

What it costs: x_m and dz_m of every micro-batch whose W pass has not run (a
layer's input and output gradient, not the whole forward's activations).
GPipe holds all micro-batches' activations anyway, so it defers by default
(one W pass per step; two on the first stage, which places its W passes where
it would wait: Note [The first stage's weight passes] in schedules.py). 1F1B's
point is to hold at most S - stage micro-batches, and deferring over the step
holds the layer inputs of all of them (schedules.max_live_micro_batches counts
them); so by default it defers only where that holds no more than the weight
gradients it saves accumulating: when a step's rows x (inputs + units) of the
deferred layers is at most their kernels' and biases' size (`defer_by_default`;
for Dense(W) layers, 2 x rows <= W). Measured (2 stages, M = 8, Adam,
`tarantella -n 2` with its defaults, medians of 3, results/pipeline_defaults):
8 x Dense(512) at batch 128 +19 % samples/s, 8 x Dense(2048) +30 % at 128 and
+11 % at 1024, where the rule defers; at 8 x Dense(512), batch 1024, where it
does not, deferring gave -2 % and +26 % peak memory.
A B pass's results include its dz's, so the backward's work runs in that
pass (not later, whenever TensorFlow's executor is free, which would keep the
tape's activations alive and blur the per-pass timestamps).

Note [The input gradient as kernel dz^T]
A B pass gives the stage before it dx = dz kernel^T. TensorFlow's own gradient
of x @ kernel computes it as one product with the kernel transposed (MatMul with
transpose_b). At a micro-batch's few rows oneDNN runs that product about twice
as slowly as one that reads the kernel as it is stored: the same product, its
additions in another order, is (kernel dz^T)^T, with the kernel untransposed and
only dz transposed, then a transpose of the small rows x units result. Measured on the
2-core machine, one thread, 4 chained layers, medians of 3 alternating rounds,
ms per product (python -m bench.pipeline.input_gradient, load 0.7):
                          rows  4     8     16    32    64    128
    Dense(512)   dz K^T         0.088 0.091 0.169 0.231 0.310 0.508
                 (K dz^T)^T     0.137 0.098 0.121 0.165 0.243 0.432
    Dense(2048)  dz K^T         1.22  2.02  2.37  3.14  4.69  7.97
                 (K dz^T)^T     1.31  1.31  1.25  1.83  3.67  6.82
Below 8 rows TensorFlow's form stays (faster there at both widths; at 8 rows
the other takes 1.08 x its time at Dense(512), 0.65 x at Dense(2048)). The two forms
add the same products in another order, so dx can differ from serial Keras's in
the last bits, as a micro-batch's products already may (a pipelined model equals
serial within tolerance: tnt-repro's EQUIVALENT); it is the same on every run,
so a pipeline stays bitwise reproducible. Only the deferred B pass takes it.
Tried for a B pass that also makes the weight gradients (1F1B's default where
deferring would hold more than it saves), through a custom gradient of the
whole layer: a 4-layer stage's forward and backward took 1.60 against 1.56 ms
with TensorFlow's own gradient at Dense(512) and 16 rows, 5.90 against 5.78 at
128 rows, 21.9 against 25.8 at Dense(2048) and 16 rows (where 1F1B defers by
default anyway); a 2-stage pipeline of 8 x Dense(512) at global batch 1024 with
it ran 6 % slower (2 A/B pairs). Not kept.

Only plain keras.layers.Dense layers (not subclasses, not quantized, no LoRA,
no mixed precision, 2-D inputs) are deferred; any other layer's weight
gradients come from the tape in the B pass as before, and a deferred layer's
variables also get whatever else the tape gives them (a kernel regularizer's
gradient). During the traced forward the deferred layers' `call` is replaced
on the instance (not the class) and restored after (`DeferredDense.recording`).
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

__all__ = ["DeferredDense", "deferrable_layers", "defer_by_default", "weight_pass_every"]

# Micro-batches of fewer rows than this take dz kernel^T, TensorFlow's own form (Note [The input gradient as
# kernel dz^T]).
_FEW_ROWS = 8


def _deferrable(layer) -> bool:
    if type(layer) is not keras.layers.Dense or not layer.trainable or not layer.built:
        return False
    if getattr(layer, "quantization_mode", None) is not None or getattr(layer, "lora_enabled", False):
        return False
    if getattr(layer, "_remat_mode", False):
        return False
    kernel = layer._kernel
    return kernel.trainable and layer.compute_dtype == kernel.dtype and kernel.dtype in ("float32", "float64")


def deferrable_layers(model: keras.Model) -> list:
    """The stage's Dense layers whose weight gradients can be deferred (module docstring)."""
    return [layer for layer in model.layers if _deferrable(layer)]


def defer_by_default(model: keras.Model, rows: int) -> bool:
    """1F1B's default (module docstring): whether the (x, dz) a step's `rows` leave in the deferrable Dense
    layers until the weight pass take at most as much memory as the weight gradients they replace."""
    layers = deferrable_layers(model)
    held = sum(rows * (layer._kernel.shape[0] + layer._kernel.shape[1]) for layer in layers)
    saved = sum(int(np.prod(layer._kernel.shape)) + (layer.bias.shape[0] if layer.bias is not None else 0)
                for layer in layers)
    return bool(layers) and held <= saved


def weight_pass_every(defer, schedule: str, model: keras.Model, rows: int, num_micro_batches: int) -> int | None:
    """Micro-batches per weight pass (Note [Deferred weight gradients]) for the stage's `model` at `rows` rows per
    replica and step, with defer_weight_gradients `defer`; None: each backward accumulates its own weight
    gradients. True: one weight pass after the last backward (all of a step's micro-batches in one product per
    layer). The default (None) is True for GPipe, which holds every micro-batch's activations anyway; for 1F1B,
    whose point is to hold at most S - stage micro-batches, True only where the deferred layers' inputs and
    output gradients take no more memory than the weight gradients they save accumulating (defer_by_default)."""
    if defer is None:
        defer = schedule == "gpipe" or defer_by_default(model, rows)
    if defer is False:
        return None
    if defer is True:
        return num_micro_batches
    return int(defer)


class DeferredDense:
    """Records, for the deferred layers of one stage, each micro-batch's (x, dz) as its backward pass is
    traced, and builds the weight passes from them."""

    def __init__(self, model: keras.Model, variables: list):
        self.layers = deferrable_layers(model)
        self._variables = list(variables)
        index = {id(v): i for i, v in enumerate(variables)}
        # Per layer: the positions of its kernel and bias in `variables` (None for no bias).
        self._slots = [(index[id(layer._kernel)], index[id(layer.bias)] if layer.bias is not None else None)
                       for layer in self.layers]
        self._pending = [[] for _ in self.layers]     # per layer: (x, dz) of micro-batches not yet in a W pass

    def __bool__(self) -> bool:
        return bool(self.layers)

    @contextlib.contextmanager
    def recording(self):
        """While tracing a forward pass under a tape: the deferred layers' weights get no gradient from the
        tape; their backward records (x, dz) instead."""
        for i, layer in enumerate(self.layers):
            object.__setattr__(layer, "call", self._call_of(i, layer))
        try:
            yield
        finally:
            for layer in self.layers:
                object.__delattr__(layer, "call")

    def _call_of(self, i: int, layer):
        pending = self._pending[i]

        def call(inputs, training=None):
            inputs = tf.convert_to_tensor(inputs)
            if inputs.shape.rank != 2:
                return keras.layers.Dense.call(layer, inputs, training=training)
            kernel = tf.convert_to_tensor(layer._kernel.value)
            bias = tf.convert_to_tensor(layer.bias.value) if layer.bias is not None else None
            return _dense(inputs, kernel, bias, layer.activation, pending)

        return call

    def mark(self) -> list[int]:
        return [len(pending) for pending in self._pending]

    def recorded_since(self, mark: list[int]) -> list:
        """The output gradients recorded since `mark`: a backward pass's results, so that they are computed
        in that pass (Note [The schedule inside one graph] in compiled_step.py) and not later, when TensorFlow
        happens to run them (then the tape's activations would be held until the weight pass)."""
        return [dz for pending, start in zip(self._pending, mark) for _, dz in pending[start:]]

    def weight_pass(self, gradients: list, update=None) -> list:
        """Traced: the weight gradients of the micro-batches recorded since the last weight pass, added into
        `gradients` (a list by variable position, None where none yet); returns the new tensors.
        update(gradients, variables): the step's last weight pass updates each layer's variables as their
        gradients are final, and the next layer's product waits for it (Note [Updates in the weight pass] in
        updates_in_weight_pass.py); it returns what to wait for."""
        done, updated = [], []
        for (kernel, bias), pending in zip(self._slots, self._pending):
            if not pending:
                continue
            with tf.control_dependencies(updated):
                x = tf.concat([p[0] for p in pending], 0) if len(pending) > 1 else pending[0][0]
                dz = tf.concat([p[1] for p in pending], 0) if len(pending) > 1 else pending[0][1]
                parts = [(kernel, tf.matmul(x, dz, transpose_a=True))]
                if bias is not None:
                    parts.append((bias, tf.reduce_sum(dz, 0)))
            pending.clear()
            for slot, grad in parts:
                gradients[slot] = grad if gradients[slot] is None else gradients[slot] + grad
                done.append(gradients[slot])
            if update is not None:
                slots = [slot for slot, _ in parts]
                updated = update([gradients[s] for s in slots], [self._variables[s] for s in slots])
                done += updated
        return done


def _dense(x, kernel, bias, activation, pending):
    """y = activation(x kernel + bias) whose gradient gives x's and records (x, dz) for the weight pass."""

    @tf.custom_gradient
    def forward(x):
        z = tf.matmul(x, kernel)
        if bias is not None:
            z = z + bias
        if activation is None or activation is keras.activations.linear:
            return z, lambda dy: _input_gradient(x, dy, kernel, pending)
        with tf.GradientTape() as tape:
            tape.watch(z)
            y = activation(z)

        def backward(dy):
            return _input_gradient(x, tape.gradient(y, z, output_gradients=dy), kernel, pending)

        return y, backward

    return forward(x)


def _input_gradient(x, dz, kernel, pending):
    pending.append((x, dz))
    rows = dz.shape[0]
    if rows is not None and rows < _FEW_ROWS:
        return tf.matmul(dz, kernel, transpose_b=True)
    return tf.transpose(tf.matmul(kernel, dz, transpose_b=True))   # Note [The input gradient as kernel dz^T]
