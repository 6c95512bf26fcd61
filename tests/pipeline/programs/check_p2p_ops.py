"""The in-graph transfer ops (TntSend / TntReceive, csrc/tf/p2p_ops.cc) on 2
ranks, as the pipeline step uses them: posted by TensorFlow's own thread
(Note [Channels post on the caller's thread] in csrc/engine/peer_channels.hpp).
Checks, each printing "OK <name>":
- round trips: rank 0 sends tensors of 4 B .. 4 MiB, rank 1 sends each back
  plus one; values intact, in one traced function per rank, many steps;
- a send followed by a long computation on the sender: the receiver still
  gets the tensor (it does not wait for the sender's compute);
- a receive nobody sends fails the op, after TNT_TIMEOUT_SECONDS, with an
  error naming the peer and the tag (the progress thread expires it: Note
  [Transfers expire on the progress thread]), while the receiving rank keeps
  posting other transfers that complete (they must not hold the expiry off).
"""
import time

import numpy as np
import tensorflow as tf

import tarantella as tnt
from tarantella import tf_ops
from tarantella import channels as peer

rank, size = tnt.get_rank(), tnt.get_size()
assert size == 2, "run on 2 ranks"
partner = 1 - rank
ops = tf_ops.load_ops()
channels = peer.open_channels()
CH = channels.id
SHAPES = [(1,), (1000,), (256, 256), (1024, 1024)]   # 4 B .. 4 MiB of float32


@tf.function
def round_trips(step):
    # Every send's token is consumed as data (a token used only as a control dependency is pruned
    # with its send: the ops are stateless, Note [Transfers are stateless async ops]).
    trigger = tf.cast(step, tf.int32)
    results = []
    for i, shape in enumerate(SHAPES):
        if rank == 0:
            value = tf.fill(shape, tf.cast(step, tf.float32) * 10.0 + i)
            token = ops.tnt_send(value, channels=CH, peer=partner, tag=10 + i)
            with tf.control_dependencies([token]):
                back = ops.tnt_receive(trigger, T=tf.float32, shape=shape, channels=CH, peer=partner, tag=20 + i)
            results.append(back - value + tf.cast(token, tf.float32))
        else:
            got = ops.tnt_receive(trigger, T=tf.float32, shape=shape, channels=CH, peer=partner, tag=10 + i)
            token = ops.tnt_send(got + 1.0, channels=CH, peer=partner, tag=20 + i)
            results.append(got - (tf.cast(step, tf.float32) * 10.0 + i) + tf.cast(token, tf.float32))
    return results


# Traced on both ranks before the first transfer is posted: tracing takes longer than the short timeout.
round_trips.get_concrete_function(tf.TensorSpec((), tf.int32))
tnt.barrier()
expected = 1.0 if rank == 0 else 0.0
for step in range(20):
    for diff in round_trips(tf.constant(step, tf.int32)):
        assert np.all(diff.numpy() == expected), f"step {step}: a transfer arrived corrupted"
print("OK round trips 4B..4MiB", flush=True)


@tf.function
def send_then_compute(one):
    """Rank 0 sends, then multiplies matrices for a while; rank 1 times the receive's arrival. (Transfers
    must not depend on constants only: graph optimisation would run them while folding constants.) The
    computation starts from the sent tensor, as a pipeline stage's next pass follows the activation it sends:
    two independent branches run one after the other under one inter-op thread, in an order of TensorFlow's
    choosing (Note [Thread defaults] in tarantella/launcher/rank_wrapper.py), and the check is that the posted
    send does not wait for the computation after it, not which branch TensorFlow starts first."""
    if rank == 0:
        sent = tf.ones((256, 256)) * tf.cast(one, tf.float32)
        token = ops.tnt_send(sent, channels=CH, peer=partner, tag=30)
        a = tf.random.stateless_normal((512, 512), seed=[1, 2]) + sent[0, 0] * 0.0
        for _ in range(60):
            a = tf.linalg.matmul(a, a) / 512.0
        with tf.control_dependencies([token, a]):
            return tf.reduce_sum(a) * 0.0 + tf.cast(token, tf.float32), tf.timestamp()
    got = ops.tnt_receive(one, T=tf.float32, shape=(256, 256), channels=CH, peer=partner, tag=30)
    with tf.control_dependencies([got]):
        return tf.reduce_sum(got), tf.timestamp()


send_then_compute.get_concrete_function(tf.TensorSpec((), tf.int32))
tnt.barrier()
total, finished = send_then_compute(tf.constant(1))
times = tnt.allgather_object(float(finished.numpy()))
if rank == 1:
    assert float(total.numpy()) == 256.0 * 256.0, total
    # Only order, not timing, is asserted: the tensor arrived before the sender's compute ended.
    assert times[1] < times[0], f"the receive completed at {times[1]}, after the sender's compute ({times[0]})"
print("OK a send arrives while its sender computes", flush=True)
tnt.barrier()

if rank == 0:
    @tf.function
    def lost_receive(trigger):
        # Tag 99 never comes; tags 40.. do, one after another, while it waits.
        lost = ops.tnt_receive(trigger, T=tf.float32, shape=(3,), channels=CH, peer=partner, tag=99)
        for i in range(40):
            got = ops.tnt_receive(trigger, T=tf.float32, shape=(1,), channels=CH, peer=partner, tag=40 + i)
            trigger = tf.cast(got[0], tf.int32)
        return lost, trigger

    lost_receive.get_concrete_function(tf.TensorSpec((), tf.int32))
    tnt.barrier()
    began = time.monotonic()
    try:
        lost_receive(tf.constant(0))
        raise AssertionError("no timeout")
    except tf.errors.InternalError as error:
        message = str(error)
        assert f"from rank {partner} with tag 99" in message and "timed out" in message, message
        line = next(line for line in message.splitlines() if "tag 99" in line)
        print(f"TIMEOUT after {time.monotonic() - began:.1f} s: {line}", flush=True)
else:
    tnt.barrier()
    for i in range(40):
        channels.send(partner, 40 + i, np.zeros(1, np.float32)).wait()
        time.sleep(0.05)
    time.sleep(3.5)  # so that this rank's barrier does not time out while its partner waits
tnt.barrier()
channels.close()
print("OK done", flush=True)
