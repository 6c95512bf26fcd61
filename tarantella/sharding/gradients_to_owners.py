"""Sum each gradient over the ranks on its variable's owner only (ZeRO stage 2, shard="gradients").

Note [Gradients summed on their owners]
Under shard="gradients" each rank keeps the optimizer state of its own
variables (stage 1, Note [A sharded update] in update.py) and also receives
only their summed gradients: a reduce-scatter, by whole variables, in place of
the fused allreduce. Every rank sends the gradient of each variable it does
not own to the owner, through the engine's point-to-point channels, as soon
as backprop has produced it (the sends are ordered by their data alone, Note
[Start and finish ops are not chained] in graph_allreduce.py), and the owner
adds the N-1 gradients it receives to its own. Each rank thus sends (N-1)/N of
the gradient bytes and receives as many: a reduce-scatter's volume, half of
an allreduce's, with no bucket buffer and no full-size sum. The owner posts a
variable's receives once its own gradient of it exists, so receive buffers
are held for the gradients backprop is producing now, not for the whole model
from the start of the step, and a local gradient is freed once it has left.
A large variable's gradient is summed in parts, each by another rank, so that
the owner does not receive N - 1 whole gradients (Note [Spread transfers] in
spread_transfers.py).
The owner adds the ranks' gradients in the order of the allreduce it
replaces: in rank order, left to right, as the engine's shared-memory
reduction does (reduce_many in reduce_kernels.hpp; `auto` on one node, and any
algorithm at 2 ranks), or, with the recursive_doubling algorithm
(tnt-repro's exact mode), pairwise by rank bits, (r0 + r1) + (r2 + r3), as
recursive doubling combines them (at 3 ranks (r0 + r1) + r2: its fold first,
exact_reduction.ranks_tree_sum). So the sums are
bitwise those of unsharded data parallelism there; across nodes the ring's,
Rabenseifner's and the hierarchical allreduce's orders vary by chunk, and the
sums may differ from theirs by rounding. The whole-model decisions that need every gradient
(global_clipnorm, a LossScaleOptimizer's skip) are taken from per-variable
figures each owner computes and all ranks exchange (update.py).
"""
from __future__ import annotations

import tensorflow as tf

from tarantella import runtime, tf_ops
from tarantella._repro import exact_reduction
from tarantella.step.graph_allreduce import unchained
from tarantella.sharding.send_counter import SendCounter
from tarantella.sharding.spread_transfers import SpreadTransfers, data_token
from tarantella.timeline import graph_marks

__all__ = ["GradientsToOwners"]


class GradientsToOwners:
    """Made on every rank alike; `channels` are the sharded optimizer's own for gradients, so its tags (the
    variables' indices in the optimizer's list) meet no other transfer."""

    def __init__(self, rank: int, size: int, channels, total_bytes: int = 0):
        self.rank = rank
        self.size = size
        self.channels = channels          # kept open while the step graph uses its id
        self._ops = tf_ops.load_ops()
        self.sends = SendCounter("tnt_gradient_sends")
        self.pairwise = runtime.settings().allreduce_algorithm == "recursive_doubling"  # Note above
        self._spread = SpreadTransfers(rank, size, channels, graph_marks.TO_OWNER, total_bytes)

    def __call__(self, gradients: list, owners: list, tags: list, overlap: bool = True) -> list:
        """Traced: for each gradient, its sum over the ranks if this rank owns its variable, else None (the same
        call on every rank, with this rank's gradients, already weighted). overlap=False: no transfer starts
        before every gradient exists, as the allreduce's no-overlap mode."""
        if not overlap and gradients:
            with tf.control_dependencies(gradients):
                gradients = [tf.identity(gradient) for gradient in gradients]
        summed, tokens = [], []
        for gradient, owner, tag in zip(gradients, owners, tags):
            parts = self._spread.parts(gradient.shape, gradient.dtype)
            if parts is not None:   # Note [Spread transfers]: through every rank
                total, sends = self._spread.reduce(gradient, owner, tag, self.sends.after([gradient]), self._sum,
                                                   parts)
                summed.append(total)
                tokens.extend(sends)
                continue
            if owner != self.rank:
                token = unchained(self._ops.tnt_send(gradient, channels=self.channels.id, peer=owner, tag=tag))
                tokens.append(graph_marks.mark(token, graph_marks.TO_OWNER))  # timeline only
                summed.append(None)
                continue
            after = self.sends.after([gradient])
            parts = [gradient if peer == self.rank else graph_marks.mark(  # timeline only
                     unchained(self._ops.tnt_receive(after, T=gradient.dtype, shape=tuple(gradient.shape),
                                                     channels=self.channels.id, peer=peer, tag=tag)),
                     graph_marks.TO_OWNER)
                     for peer in range(self.size)]
            # Note [Every received value is waited for] (gathered_weights.py): a sum nobody reads (a tape asked
            # about other variables) would drop its receives, and the senders would wait
            tokens.extend(data_token(part) for peer, part in enumerate(parts) if peer != self.rank)
            summed.append(self._sum(parts))
        self.sends.count(tokens)
        return summed

    def _sum(self, parts: list) -> tf.Tensor:
        """The ranks' gradients added in the order of the allreduce they replace (Note above)."""
        if self.pairwise:
            return exact_reduction.ranks_tree_sum(parts)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
