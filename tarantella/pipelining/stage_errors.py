"""Errors of a pipelined step name the stage they happened in.

A step that fails on one rank ends the job at once (Note [A waiting op finishes once: by the engine or by
cancellation] in csrc/tf/pending_op.h), and the launcher's report quotes the failing rank's error line and
names its rank and host. The stage and replica are this module's part: the error keeps its TensorFlow class
(code that catches InvalidArgumentError still does) and its message starts with where it happened."""
from __future__ import annotations

import tensorflow as tf

from tarantella.pipelining.topology import Placement

__all__ = ["naming_the_stage"]


def naming_the_stage(error: tf.errors.OpError, placement: Placement) -> tf.errors.OpError:
    where = f"pipeline stage {placement.stage} of {placement.num_stages}"
    if placement.num_replicas > 1:
        where += f", replica {placement.replica} of {placement.num_replicas}"
    renamed = type(error)(error.node_def, error.op, f"in {where}: {error.message}")
    return renamed.with_traceback(error.__traceback__)
