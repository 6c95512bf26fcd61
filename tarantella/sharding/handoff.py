"""Hand each updated weight from its owner to the other ranks, inside the compiled step.

Note [Handing the updated weights over]
Under shard="optimizer" (ZeRO stage 1) a variable is updated on its owner only
(Note [Whole variables to owners, balanced by bytes] in owners.py); the other
ranks then need its new value. The owner sends it, as soon as its own update
is done, to every other rank through the engine's point-to-point channels
(the pipeline's TntSend/TntReceive ops); each other rank receives it and
assigns it. The bytes travel as they are, so every rank ends with the owner's
bits exactly. The transfers are ordered by their data alone (Note [Start and
finish ops are not chained] in graph_allreduce.py), so a rank's sends of
early-updated variables overlap its later updates and no rank waits for a
transfer it does not need. A receive is posted once this rank's own updates
are done: its buffer is the incoming weight, and posting it at the start of
the step would hold (N-1)/N of the weights beside the step's activations.
An owner sends each of its variables to the N-1 other ranks, so each rank
receives (N-1)/N of the model's bytes: an allgather's volume, point-to-point
rather than in a ring, which on one node (shared memory, single copy) costs
the same and keeps no persistent buffer (the weights stay the only full copy).
A large variable goes in parts relayed by every rank, so that the owner does
not send it N - 1 times (Note [Spread transfers] in spread_transfers.py). The sends
are kept in the graph by a counter (Note [Sends are kept by a counter] in
send_counter.py).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella import tf_ops
from tarantella.step.graph_allreduce import unchained
from tarantella.sharding.send_counter import SendCounter
from tarantella.sharding.spread_transfers import SpreadTransfers
from tarantella.timeline import graph_marks

__all__ = ["WeightHandoff"]


class WeightHandoff:
    """Made on every rank alike; `channels` are this optimizer's own, so its tags (the variables' indices in the
    optimizer's list) meet no other user of the engine's channels."""

    def __init__(self, rank: int, size: int, channels, total_bytes: int = 0, group=None):
        """group: the collectives.Group whose members `rank`, `size` and the owners count (None: the world; a
        pipeline stage's replicas, Note [A stage's replicas share its optimizer state] in
        tarantella/pipelining/step_collectives.py)."""
        self.rank = rank
        self.size = size
        self.channels = channels          # kept open while the step graph uses its id
        self.channels_id = channels.id
        self._ops = tf_ops.load_ops()
        self.sends = SendCounter("tnt_weight_sends")
        self._world_rank = group.world_rank_of if group is not None else int
        self._spread = SpreadTransfers(rank, size, channels, graph_marks.HANDED_OVER, total_bytes, group)

    def __call__(self, variables: list, owners: list, tags: list, after) -> None:
        """Traced, after this rank's updates: the owners' new values everywhere (the same call on every rank).
        `after`: a tensor that exists once this rank's own updates are done (the receives are posted then)."""
        after = tf.cast(after, tf.int32)
        sent = []
        for variable, owner, tag in zip(variables, owners, tags):
            parts = self._spread.parts(variable.shape, variable.dtype)
            if parts is not None:   # Note [Spread transfers]: through every rank
                value = tf.convert_to_tensor(variable) if owner == self.rank else None
                received, sends, _ = self._spread.broadcast(value, owner, tuple(variable.shape), variable.dtype,
                                                            tag, after, parts)
                sent.extend(sends)
                if owner != self.rank:
                    variable.assign(received)
                    graph_marks.mark_after_updates([variable], graph_marks.HANDED_OVER)  # timeline only
                continue
            if owner == self.rank:
                value = tf.convert_to_tensor(variable)  # read after this rank's update of it
                for peer in range(self.size):
                    if peer != self.rank:
                        token = unchained(self._ops.tnt_send(value, channels=self.channels_id,
                                                             peer=self._world_rank(peer), tag=tag))
                        sent.append(graph_marks.mark(token, graph_marks.HANDED_OVER))  # timeline only
            else:
                received = unchained(self._ops.tnt_receive(after, T=tf.as_dtype(variable.dtype),
                                                           shape=tuple(variable.shape),
                                                           channels=self.channels_id,
                                                           peer=self._world_rank(owner), tag=tag))
                variable.assign(received)
                graph_marks.mark_after_updates([variable], graph_marks.HANDED_OVER)  # timeline only
        self.sends.count(sent)
