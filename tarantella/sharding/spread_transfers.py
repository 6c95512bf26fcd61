"""One variable between its owner and the other ranks, in parts relayed by every rank (ZeRO stages 1-3).

Note [Spread transfers]
A variable belongs, whole, to one rank (Note [Whole variables to owners,
balanced by bytes] in owners.py). Sent directly, its new value leaves the
owner N - 1 times (the hand-over of stages 1-2, the gathers of stage 3), and
its gradient reaches the owner N - 1 times (stages 2-3): the owner's link
carries (N - 1) x its bytes, so the transfer grows with the rank count, and
with few large variables only a few ranks carry all of it. Spread, a
variable of at least --shard-spread bytes (from 3 ranks) is cut into N - 1
parts of its flattened elements, one per other rank (its holder):
- to every rank (broadcast): the owner sends each holder its part; each holder
  sends its part to the other holders; every rank joins the parts. A rank
  sends and receives about the variable's bytes once, whatever N (the
  scatter-allgather broadcast of large messages). The parts are copies, so
  every rank has the owner's bits.
- summed on the owner (reduce): each rank sends each holder that holder's part
  of its gradient; the holder adds the N parts in rank order, as the owner
  adds whole gradients (Note [Gradients summed on their owners]: element by
  element the same additions in the same order, so the same bits), and sends
  the sum to the owner, which joins them.
Every message of one variable goes from a different sender to its receiver
(the owner to holders, holders to holders, holders to the owner), so all carry
the variable's own tag. Smaller variables go whole (latency: N - 1 messages
per part outweigh the bytes saved). Where the transfers of many variables run
together (the hand-over after the update, the gradients of a step), whole
variables balanced by bytes already give each rank about (N - 1)/N of all
bytes to send and receive; spreading costs each rank the variable's bytes
(more at small N) and a second hop, and pays where one variable is more than
a rank's fair share (1/N of all the bytes): its owner would carry N - 1 times
it. So there only those are spread. A layer's gather (stage 3) runs alone,
its owners' links the only ones busy: there any large variable is spread.
Only where the ranks span several nodes: on one node the engine's channels
are shared memory, where each receiver copies from the sender's buffer on its
own core and no link is the owner's, and spreading only doubles the bytes
copied (measured: a 4-rank step of stage 3 on the 134 M-parameter MLP, 2
cores, 2.17 s spread against 1.79 s whole).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tarantella import runtime, tf_ops
from tarantella.step.graph_allreduce import unchained
from tarantella.timeline import graph_marks

__all__ = ["SpreadTransfers", "data_token"]


def data_token(received: tf.Tensor) -> tf.Tensor:
    """An int32 scalar computed from a received tensor's data (its first element), which the graph optimiser can
    neither fold nor compute without the receive (Note [Every received value is waited for] in
    gathered_weights.py)."""
    first = tf.reshape(received, [-1])[:1]
    return tf.cast(tf.reduce_any(tf.math.is_nan(tf.cast(first, tf.float32))), tf.int32)


class SpreadTransfers:
    """Made on every rank alike; `channels`: the caller's own (its tags meet no other transfer)."""

    def __init__(self, rank: int, size: int, channels, mark: str, total_bytes: int = 0, group=None):
        """total_bytes: of all the variables whose transfers run together (the hand-over, a step's gradients);
        those not above a rank's fair share of them go whole (Note above). 0: each transfer alone (a layer's
        gather). group: the collectives.Group whose members `rank` and `size` count (None: the world)."""
        self.rank, self.size, self.channels = rank, size, channels
        self._world_rank = group.world_rank_of if group is not None else int
        self.mark = mark    # the timeline's name for these transfers
        self.spread_bytes = runtime.settings().shard_spread_bytes
        self.fair_share = total_bytes / size
        # Note above: on one node, never
        self.across_nodes = (group.node_count if group is not None else runtime.world_group().node_count) > 1
        self.traced = 0     # transfers traced in parts (tests: evidence that they ran)
        self._ops = tf_ops.load_ops()

    def parts(self, shape, dtype) -> list[int] | None:
        """The element counts of a spread variable's parts, None if it goes whole (Note above)."""
        elements = int(np.prod(shape))
        nbytes = elements * tf.as_dtype(dtype).size
        holders = self.size - 1
        if (not self.across_nodes or holders < 2 or nbytes < self.spread_bytes or nbytes <= self.fair_share
                or elements < holders):
            return None
        return [elements // holders + (1 if k < elements % holders else 0) for k in range(holders)]

    def _holders(self, owner: int) -> list[int]:
        return [peer for peer in range(self.size) if peer != owner]

    def _send(self, tensor, peer: int, tag: int) -> tf.Tensor:
        token = self._ops.tnt_send(tensor, channels=self.channels.id, peer=self._world_rank(peer), tag=tag)
        return graph_marks.mark(unchained(token), self.mark)   # timeline only

    def _receive(self, after, dtype, count: int, peer: int, tag: int) -> tf.Tensor:
        return graph_marks.mark(unchained(self._ops.tnt_receive(after, T=dtype, shape=(count,),
                                                                channels=self.channels.id,
                                                                peer=self._world_rank(peer), tag=tag)),
                                self.mark)   # timeline only

    def broadcast(self, value, owner: int, shape, dtype, tag: int, after, parts: list[int]):
        """Traced, every rank alike: (the owner's value, send tokens, receive tokens); `value`: the owner's (None
        elsewhere); this rank's receives are posted once `after` exists."""
        dtype = tf.as_dtype(dtype)
        self.traced += 1
        holders = self._holders(owner)
        if self.rank == owner:
            pieces = tf.split(tf.reshape(value, [-1]), parts)
            return value, [self._send(piece, holder, tag) for piece, holder in zip(pieces, holders)], []
        mine = holders.index(self.rank)
        own_part = self._receive(after, dtype, parts[mine], owner, tag)
        sends = [self._send(own_part, holder, tag) for holder in holders if holder != self.rank]
        pieces = [own_part if k == mine else self._receive(after, dtype, parts[k], holder, tag)
                  for k, holder in enumerate(holders)]
        return tf.reshape(tf.concat(pieces, 0), shape), sends, [data_token(piece) for piece in pieces]

    def reduce(self, gradient, owner: int, tag: int, after, add, parts: list[int]):
        """Traced, every rank alike: (the sum over the ranks of `gradient` on the owner, None elsewhere; tokens of
        the sends and of the owner's receives). `add` sums a list of tensors in rank order; receives are posted once
        `after` exists."""
        self.traced += 1
        holders = self._holders(owner)
        pieces = tf.split(tf.reshape(gradient, [-1]), parts)
        sends = [self._send(piece, holder, tag) for piece, holder in zip(pieces, holders) if holder != self.rank]
        if self.rank != owner:
            mine = holders.index(self.rank)
            summed = add([pieces[mine] if peer == self.rank else
                          self._receive(after, gradient.dtype, parts[mine], peer, tag) for peer in range(self.size)])
            return None, sends + [self._send(summed, owner, tag)]
        sums = [self._receive(after, gradient.dtype, count, holder, tag) for count, holder in zip(parts, holders)]
        # kept also where nobody reads the sum (Note [Every received value is waited for] in gathered_weights.py)
        return tf.reshape(tf.concat(sums, 0), tf.shape(gradient)), sends + [data_token(part) for part in sums]
