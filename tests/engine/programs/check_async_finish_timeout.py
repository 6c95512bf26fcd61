"""A graph's async finish op whose bucket never fills ends in an error, not a hang.

Run with TNT_TIMEOUT_SECONDS=2 on 2 ranks. Each step below hands over only tensor 0 of a bucket
that holds tensors 0 and 1, then waits for tensor 0's sum through TntFinishAllreduce (the async
op that fit's train steps use): the bucket can never be reduced. The finish must fail within
about twice the timeout, naming the tensor that was never marked ready, on every rank.
Prints "OK <what>" per check and "ELAPSED <seconds>".
"""
import time

import tensorflow as tf

import tarantella as tnt
from tarantella.step.graph_allreduce import GraphAllreducer

allreducer = GraphAllreducer([tf.TensorShape([10]), tf.TensorShape([10])], [tf.float32, tf.float32],
                             fusion_threshold_bytes=1 << 20)
assert allreducer.bucket_count == 1
ops, reducer = allreducer._ops, allreducer._reducer.id


@tf.function
def half_step(x):
    token = ops.tnt_start_allreduce(x, reducer=reducer, tensor=0)
    return ops.tnt_finish_allreduce(token, T=tf.float32, shape=[10], reducer=reducer, tensor=0)


started = time.monotonic()
try:
    half_step(tf.ones(10))
    raise AssertionError("the finish op returned although tensor 1 was never marked ready")
except (tf.errors.DeadlineExceededError, tf.errors.InternalError, tf.errors.AbortedError,
        tf.errors.UnknownError) as error:
    # TensorFlow wraps the engine's one-line error ("Graph execution error: ... tarantella: ...").
    message = next((line for line in error.message.splitlines() if "tarantella:" in line), error.message)
    assert "timed out" in message and "tensor(s) 1 of this rank" in message, error.message
    print(f"OK async finish fails naming the missing tensor: {message}", flush=True)
print(f"ELAPSED {time.monotonic() - started:.1f}", flush=True)

# The reducer is failed from now on: a later step raises at once instead of waiting again.
started = time.monotonic()
try:
    half_step(tf.ones(10))
    raise AssertionError("a failed reducer accepted another step")
except tf.errors.OpError as error:
    print(f"OK later step fails at once ({time.monotonic() - started:.1f} s)", flush=True)
print(f"rank {tnt.get_rank()} done", flush=True)
