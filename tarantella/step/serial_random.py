"""Random layers draw, for each sample, the values serial Keras draws for it.

Note [Random values by sample, not by rank]
Keras's random layers (Dropout and its family, GaussianNoise, the dropout in
MultiHeadAttention, the Random* augmentation layers) and `keras.random` calls
draw with TensorFlow's stateless generator: from the seed of the layer's
SeedGenerator (the same on every rank: tnt.Model starts every rank from the
master's variables, seed states included) the op derives a Philox key and
counter, and value i of the draw is a fixed function of (key, counter, i).
Serial Keras draws a tensor of shape [B, ...] for the global batch of B; rank
r runs rows [s, s + n) of it and, left alone, would draw a [n, ...] tensor from
the same counter: serial's rows 0..n-1, the same on every rank. So while
tarantella traces a data-parallel step, every such draw whose leading
dimension is this rank's row count is made from the counter advanced to the
rank's first value, s * (values per row): TensorFlow's kernels produce values
in groups (4 per Philox call for 4-byte and smaller dtypes, 2 for 8-byte ones;
truncated normal reserves 256 Philox outputs per group, as rejection
sampling needs), group g from counter + g * (counter steps per group), so the
advanced counter yields exactly serial's values for those rows. Where the
first value falls inside a group, the rank draws from that group's start and
drops the few values before its own. Nothing is drawn twice, nothing is
communicated; the cost is one 128-bit counter addition per draw (and a slice
where rows are not a multiple of the group).

The rule, and its limits:
- Recognised: the V2 stateless ops behind tf.random.stateless_uniform /
  _normal / _truncated_normal (all dtypes), tf.nn.experimental.stateless_dropout,
  and so every keras.random function built on them (uniform, normal,
  truncated_normal, randint, dropout, shuffle) under the TensorFlow backend.
- A draw is per-sample when its leading dimension equals the rows this rank
  runs; one without the batch (a scalar, a per-channel vector) is the same on
  every rank and equal to serial's already. A draw of leading dimension 1 on a
  rank that runs one sample counts as per-sample (it cannot be told apart).
- Not recognised, with one warning on the master naming the op (and with it
  the layer): stateful random ops (tf.random.uniform, tf.random.Generator) and
  stateless ops drawing a variable number of values per output
  (tf.random.stateless_categorical, _gamma, _binomial, _poisson, _parameterized_truncated_normal).
- The counter layout is Philox's (TensorFlow's choice on CPU and GPU); on a
  device that picks ThreeFry (TPU) draws are left alone with a warning.
- A step that calls the model once per piece of its batch (exact mode's
  virtual micro-batches, a pipeline's micro-batches) gives every call the
  step's seed states and the piece's position (StepSeedStates): serial's values
  for every piece's samples.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading

import tensorflow as tf
from tensorflow.python.ops import gen_stateless_random_ops_v2 as _generated

from tarantella import runtime
from tarantella.step import batch_position

__all__ = ["install", "uninstall", "warn_unrecognised", "rows_reversed", "unmatched", "StepSeedStates"]

logger = logging.getLogger("tarantella")
_reversal = threading.local()  # rows_reversed's rows while active
_unmatched: set[str] = set()   # "op name (op type)" of every random op warn_unrecognised found

_PHILOX, _THREEFRY = 1, 2
_TRUNCATED_GROUP_RESERVE = 256  # Philox outputs a truncated-normal group may consume (random_op_cpu.h)
_PHILOX_VALUES = 4  # 32-bit values per Philox call

# op function -> (how its kernel spends the counter: "plain", one Philox call per group, or "truncated";
#                 the dtype when the call names none; None: the dtype is minval's)
_RECOGNISED = {
    "stateless_random_uniform_v2": ("plain", tf.float32),
    "stateless_random_normal_v2": ("plain", tf.float32),
    "stateless_random_uniform_int_v2": ("plain", None),
    "stateless_random_uniform_full_int_v2": ("plain", tf.uint64),
    "stateless_truncated_normal_v2": ("truncated", tf.float32),
}
_UNRECOGNISED_OP_TYPES = frozenset({
    "RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt", "RandomShuffle", "Multinomial",
    "RandomGamma", "RandomPoissonV2", "StatefulUniform", "StatefulStandardNormalV2", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulTruncatedNormal", "StatelessMultinomial", "StatelessRandomGammaV3",
    "StatelessRandomBinomial", "StatelessRandomPoisson", "StatelessParameterizedTruncatedNormal",
})


def _group(kind: str, dtype: tf.DType) -> tuple[int, int]:
    """(values per group, counter steps per group) of a draw's kernel."""
    values = 2 if dtype.size == 8 else 4
    steps = values * _TRUNCATED_GROUP_RESERVE // _PHILOX_VALUES if kind == "truncated" else 1
    return values, steps


def _advance(counter: tf.Tensor, steps: tf.Tensor) -> tf.Tensor:
    """Philox's 128-bit counter (two uint64, low first) plus `steps`, with the carry."""
    low = counter[0] + tf.cast(steps, tf.uint64)
    carry = tf.cast(low < counter[0], tf.uint64)
    return tf.concat([tf.stack([low, counter[1] + carry]), counter[2:]], axis=0)


def _serial_rows(original, kind: str, default_dtype):
    @functools.wraps(original)
    def draw(shape, key, counter, alg, *args, **kwargs):
        values = draw_at_position(shape, key, counter, alg, *args, **kwargs)
        rows = getattr(_reversal, "rows", None)
        shape = tf.convert_to_tensor(shape)
        if rows is None or shape.shape.rank != 1 or shape.shape[0] == 0:
            return values
        return tf.where(tf.equal(tf.cast(shape[0], tf.int64), rows), tf.reverse(values, [0]), values)

    def draw_at_position(shape, key, counter, alg, *args, **kwargs):
        position = batch_position.current()
        if position is None:
            return original(shape, key, counter, alg, *args, **kwargs)
        shape = tf.convert_to_tensor(shape)
        static_shape = tf.get_static_value(shape)
        if shape.shape.rank != 1 or shape.shape[0] == 0:
            return original(shape, key, counter, alg, *args, **kwargs)  # a scalar: no batch in it
        if static_shape is not None and position.static_rows is not None \
                and int(static_shape[0]) != position.static_rows:
            return original(shape, key, counter, alg, *args, **kwargs)  # not a per-sample draw
        static_alg = tf.get_static_value(alg)
        if static_alg is not None and int(static_alg) == _THREEFRY:
            _warn_once(f"a draw with the ThreeFry algorithm ({tf.get_current_name_scope()}): its counter layout "
                       f"is not Philox's, so its values stay per rank")
            return original(shape, key, counter, alg, *args, **kwargs)
        first_extra = kwargs.get("minval" if default_dtype is None else "dtype", args[0] if args else default_dtype)
        dtype = tf.as_dtype(first_extra) if default_dtype is not None else tf.convert_to_tensor(first_extra).dtype
        values_per_group, steps_per_group = _group(kind, dtype)
        sizes = tf.cast(shape, tf.int64)
        row = tf.reduce_prod(sizes[1:])
        per_sample = tf.equal(sizes[0], position.rows)
        first = tf.where(per_sample, position.start * row, tf.constant(0, tf.int64))
        counter = _advance(counter, (first // values_per_group) * steps_per_group)
        static_row = None if static_shape is None else int(static_shape[1:].prod())
        if static_row is not None and static_row % values_per_group == 0:
            return original(shape, key, counter, alg, *args, **kwargs)  # rows start on a group: nothing to drop
        skip = first % values_per_group
        flat = original(tf.reshape(skip + tf.reduce_prod(sizes), [1]), key, counter, alg, *args, **kwargs)
        return tf.reshape(flat[skip:], shape)
    draw.tarantella_serial_rows = True
    return draw


class StepSeedStates:
    """Traced, for a step that calls the model once per piece of its batch (exact mode's virtual micro-batches,
    a pipeline stage's micro-batches). Serial Keras calls the model once per step, so every random layer draws
    once, from one state of its SeedGenerator; `restore()` before each piece's call gives every piece that
    state (it then draws, at its samples' positions, serial's values), and the last piece's draws leave the
    states advanced once, as serial's."""

    def __init__(self, model):
        self._variables = [v for v in model.variables if v.name == "seed_generator_state"]
        self._states = [tf.identity(v) for v in self._variables]  # the step's states

    def restore(self) -> None:
        for variable, state in zip(self._variables, self._states):
            variable.assign(state)


@contextlib.contextmanager
def rows_reversed(rows):
    """Within (while tracing a step): a per-sample draw (leading dimension `rows`) comes out with its rows in
    reverse order, the draw a batch fed in reverse sample order needs so that every sample gets the values it
    gets in order: tnt-repro's calibration reverses batches (Note [Measured tolerance] in
    repro/calibration_step.py), and random layers must not make that more than a reassociation."""
    previous = getattr(_reversal, "rows", None)
    _reversal.rows = tf.cast(rows, tf.int64)
    try:
        yield
    finally:
        _reversal.rows = previous


def install() -> None:
    """Route the recognised ops through _serial_rows (idempotent). Outside a tarantella step trace the wrappers
    call TensorFlow's own functions unchanged."""
    for name, (kind, default_dtype) in _RECOGNISED.items():
        original = getattr(_generated, name)
        if not getattr(original, "tarantella_serial_rows", False):
            setattr(_generated, name, _serial_rows(original, kind, default_dtype))


def uninstall() -> None:
    """TensorFlow's own functions back: every rank draws serial's first rows again (the per-rank draws
    before serial semantics; the benchmark measures what serial draws cost against them)."""
    for name in _RECOGNISED:
        wrapper = getattr(_generated, name)
        if getattr(wrapper, "tarantella_serial_rows", False):
            setattr(_generated, name, wrapper.__wrapped__)


def warn_unrecognised(graph) -> None:
    """One warning on the master per random op in `graph` whose values cannot be made serial's."""
    for op in graph.get_operations():
        if op.type in _UNRECOGNISED_OP_TYPES:
            _unmatched.add(f"{op.name} ({op.type})")
            _warn_once(f"random op {op.name} ({op.type}) draws per rank: its values are not serial Keras's for "
                       f"this rank's samples (Note [Random values by sample, not by rank]); use keras.random / "
                       f"tf.random.stateless_* for serial-equal draws")


def unmatched() -> list[str]:
    """The random ops found so far whose values cannot be serial's ("name (type)"), for tnt-repro's records."""
    return sorted(_unmatched)


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    if runtime.is_master_rank():
        logger.warning("tarantella: %s", message)
