"""ZeRO stages 1-3 (tnt.Model(model, shard=...)) in the simulated step.

Note [Simulated sharded step]
The same rank phases as the unsharded step (bench/simulate/step_model.py: compute, stragglers, input,
BatchNormalization's statistics), and the transfers tarantella/sharding makes, with the owners its own rule
draws (assign_owners: whole variables, balanced by bytes; the profile lists gradients in backprop's order, so
the variables are given to it in forward order, about the model's). A rank's update runs on its own
variables only: update x (largest owned bytes / all bytes). Point-to-point traffic of one rank spread over the
others goes over the node's links at once: the share for ranks on its node over the intra-node link, the rest
over the node's network interface, shared by the node's ranks sending at once (spread_time).
    optimizer   the unsharded step's fused allreduce, then the smaller update, then the hand-over
                (handoff.py): each owner sends its updated variables to every other rank (N - 1 times its
                bytes out), each rank receives all it does not own; from 3 ranks a variable of at least
                --shard-spread bytes and above a rank's fair share (1/N of all bytes) goes in parts relayed
                by every rank (Note [Spread transfers]), where the ranks span several nodes: its owner sends
                it once, every other rank receives it once and relays (N-2)/(N-1) of it
    gradients   no fused buckets: each gradient goes, as backprop makes it, to its owner from every other
                rank (Note [Gradients summed on their owners]); a rank's sends queue on its link, an owner's
                receives on its own (N - 1 copies in, added at the summation speed), or, spread, every
                rank sends and receives about the gradient's bytes, adds its part, and sends the sum on;
                then the smaller update and the hand-over
    weights     per layer (a profile's layer with gradients: weight_shards.units_of), in forward order:
                its weights are gathered from their owners (an owner sends N - 1 copies of its part, a rank
                receives what it does not own), posted when the previous layer starts (one layer ahead);
                in backward order: gathered again once the layer's output gradient exists (not ahead),
                a layer's gather spreads every variable of at least --shard-spread bytes;
                the layer's forward recomputed (with its statistics allreduces) and its backward run, then
                its gradients go to their owners as under "gradients", overlapped with the layers before it;
                the smaller update; no hand-over
On GPU nodes whose engine stages in host memory (host_copies) every sent and received byte is copied
between device and host once more (host_copy_time). What the model leaves out: a link's sends and receives
are taken as independent (full duplex); gathers and gradient sends of stage 3 do not slow each other.
"""
from __future__ import annotations

import dataclasses

from bench.simulate.cluster_profile import ClusterProfile
from bench.simulate.step_model import StepPrediction, host_copy_time, predict_step, rank_phases
from tarantella import config
from tarantella.sharding.owners import assign_owners

__all__ = ["MODES", "spread_time", "predict_sharded_step"]

MODES = ("optimizer", "gradients", "weights")
SPREAD_BYTES = config.load_config({}).shard_spread_bytes   # the launcher's default


def _nodes(devices: int, cluster: ClusterProfile) -> int:
    return -(-devices // cluster.devices_per_node)


def spread_time(nbytes: float, devices: int, cluster: ClusterProfile) -> float:
    """Seconds for `nbytes` to leave (or reach) one rank, spread evenly over the other devices - 1 ranks."""
    if devices <= 1 or nbytes <= 0:
        return 0.0
    local = cluster.ranks_on_node(devices)
    others = devices - 1
    intra = cluster.intra.time(nbytes * (local - 1) / others) if local > 1 else 0.0
    inter = cluster.inter.time(nbytes * (devices - local) / others, sharing=local) if devices > local else 0.0
    return max(intra, inter)


@dataclasses.dataclass(frozen=True)
class _Variable:
    nbytes: int
    layer: str
    ready_fraction: float
    owner: int


def _variables_in_forward_order(profile: dict, devices: int) -> list[_Variable]:
    gradients = sorted(profile["gradients"], key=lambda g: -g["ready_fraction"])   # stable: forward order
    owners = assign_owners([g["bytes"] for g in gradients], devices)
    return [_Variable(g["bytes"], g["layer"], g["ready_fraction"], owner) for g, owner in zip(gradients, owners)]


def _units(variables: list[_Variable]) -> list[tuple[float, list[_Variable]]]:
    """(share of the compute, variables) per layer, in forward order: a layer's share is its ready fraction
    less the next one's (layers without weights count with the layer before them)."""
    layers = {}
    for variable in variables:
        layers.setdefault(variable.layer, []).append(variable)
    ordered = sorted(layers.values(), key=lambda vs: -vs[0].ready_fraction)
    fractions = [vs[0].ready_fraction for vs in ordered] + [0.0]
    return [(fractions[i] - fractions[i + 1], vs) for i, vs in enumerate(ordered)]


def _owned_bytes(variables: list[_Variable], devices: int) -> list[int]:
    owned = [0] * devices
    for variable in variables:
        owned[variable.owner] += variable.nbytes
    return owned


def _spread(variable: _Variable, devices: int, spread_bytes: int, fair_share: float, nodes: int) -> bool:
    """Whether the variable goes in parts through every rank (spread_transfers.SpreadTransfers.parts)."""
    return nodes > 1 and devices >= 3 and variable.nbytes >= spread_bytes and variable.nbytes > fair_share


def _gather_time(variables: list[_Variable], devices: int, cluster: ClusterProfile, copies: bool,
                 spread_bytes: int, fair_share: float = 0.0) -> float:
    """Every rank gets every one of `variables` from its owner. Whole: the owner sends N - 1 copies, the others
    receive one. Spread: the owner sends the variable once, in parts, each holder relays its part to the N - 2
    others and receives the variable once (a second hop). The busiest rank's bytes set the time."""
    out, into = [0.0] * devices, [0.0] * devices
    hops = 1
    for variable in variables:
        for rank in range(devices):
            spread = _spread(variable, devices, spread_bytes, fair_share, _nodes(devices, cluster))
            if rank == variable.owner:
                out[rank] += variable.nbytes * (1 if spread else devices - 1)
            else:
                into[rank] += variable.nbytes
                if spread:
                    out[rank] += variable.nbytes * (devices - 2) / (devices - 1)
                    hops = 2
    busiest = max(max(out), max(into))
    copy = host_copy_time(max(into), cluster, devices) if copies else 0.0
    return spread_time(busiest, devices, cluster) + (hops - 1) * cluster.intra.latency_s + copy


class _ToOwners:
    """Gradients sent to their owners as they are made. Whole: one rank's sends queue on its link ((N-1)/N of
    every gradient, in the mean), each owner's receives on its own (N - 1 copies, added). Spread: every rank
    sends and receives about the gradient's bytes, the holders add their parts, and send the sums to the owner."""

    def __init__(self, devices: int, cluster: ClusterProfile, copies: bool, spread_bytes: int, fair_share: float):
        self.devices, self.cluster, self.copies = devices, cluster, copies
        self.spread_bytes, self.fair_share = spread_bytes, fair_share
        self.sending = 0.0
        self.owner_free = [0.0] * devices
        self.spreading = 0.0   # every rank's link, for spread gradients
        self.busy = 0.0    # the transfers' own time, summed

    def send(self, variable: _Variable, ready: float) -> None:
        devices, cluster = self.devices, self.cluster
        if _spread(variable, devices, self.spread_bytes, self.fair_share, _nodes(devices, cluster)):
            part = variable.nbytes / (devices - 1)
            cost = (spread_time(variable.nbytes, devices, cluster) + devices * part / cluster.reduce_Bps
                    + spread_time(part, devices, cluster)
                    + (host_copy_time(variable.nbytes, cluster, devices) if self.copies else 0.0))
            self.spreading = max(ready, self.spreading) + cost
            self.busy += cost
            return
        sent = variable.nbytes * (devices - 1) / devices
        send = spread_time(sent, devices, cluster) + (host_copy_time(sent, cluster, devices) if self.copies else 0)
        self.sending = max(ready, self.sending) + send
        receive = (spread_time((devices - 1) * variable.nbytes, devices, cluster)
                   + (devices - 1) * variable.nbytes / cluster.reduce_Bps)
        self.owner_free[variable.owner] = max(ready, self.owner_free[variable.owner]) + receive
        self.busy += max(send, receive)

    @property
    def done(self) -> float:
        return max([self.sending, self.spreading] + self.owner_free)


def predict_sharded_step(profile: dict, cluster: ClusterProfile, micro_batch: int, devices: int, shard: str,
                         algorithm: str | None = None, real_data: bool = False, global_batch_norm: bool = True,
                         precision: str = "float32", spread_bytes: int = SPREAD_BYTES) -> StepPrediction:
    """The step of tnt.Model(model, shard=shard) on `devices` ranks (Note above); on 1 device the unsharded one.
    spread_bytes: --shard-spread (a huge value: every variable whole)."""
    if shard not in MODES:
        raise ValueError(f"shard must be one of {MODES}, got {shard!r}")
    unsharded = predict_step(profile, cluster, micro_batch, devices, algorithm, real_data=real_data,
                             global_batch_norm=global_batch_norm, precision=precision)
    if devices <= 1:
        return unsharded
    algorithm = algorithm or cluster.algorithm
    phases = rank_phases(profile, cluster, micro_batch, devices, algorithm, real_data, global_batch_norm, precision)
    variables = _variables_in_forward_order(profile, devices)
    owned = _owned_bytes(variables, devices)
    total = sum(owned)
    update = phases.update_s * max(owned) / total if total else phases.update_s
    copies = cluster.kind == "gpu" and cluster.host_copies
    statistics = phases.statistics_forward_s + phases.statistics_backward_s
    if shard == "optimizer":
        handoff = _gather_time(variables, devices, cluster, copies, spread_bytes, total / devices)
        step = unsharded.step_s - phases.update_s + update + handoff
        compute = unsharded.compute_s - phases.update_s + update
        return dataclasses.replace(unsharded, step_s=step, compute_s=compute,
                                   communication_s=unsharded.communication_s + handoff,
                                   exposed_communication_s=step - compute, algorithm=f"{unsharded.algorithm} + p2p")
    to_owners = _ToOwners(devices, cluster, copies, spread_bytes, total / devices)
    forward, backward = phases.forward_s, phases.backward_s
    if shard == "gradients":
        for variable in sorted(variables, key=lambda v: v.ready_fraction):   # backprop's order
            to_owners.send(variable, forward + backward * (variable.ready_fraction if cluster.overlap else 1.0))
        handoff = _gather_time(variables, devices, cluster, copies, spread_bytes, total / devices)
        step = max(forward + backward, to_owners.done) + update + handoff
        compute = forward + backward + update - statistics
        communication = to_owners.busy + handoff
    else:
        units = _units(variables)
        gathers = [_gather_time(vs, devices, cluster, copies, spread_bytes) for _, vs in units]
        # forward: each unit's gather posted when the previous unit starts, one gather at a time
        started = ended = gathered = 0.0
        for (share, _), gather in zip(units, gathers):
            gathered = max(started, gathered) + gather
            started = max(ended, gathered)
            ended = started + forward * share
        # backward: gathered once the output gradient exists; recompute, backward, then the gradients' sends
        link = ended
        for (share, unit_variables), gather in zip(reversed(units), reversed(gathers)):
            link = max(ended, link) + gather
            ended = link + (forward + backward) * share
            for variable in unit_variables:
                to_owners.send(variable, ended)
        step = max(ended, to_owners.done) + update
        compute = 2 * forward + backward - statistics + update
        communication = to_owners.busy + 2 * sum(gathers)
        statistics += phases.statistics_forward_s   # the recomputed forward's
    return dataclasses.replace(unsharded, step_s=step, compute_s=compute, communication_s=communication,
                               exposed_communication_s=step - compute, buckets=0, algorithm="p2p",
                               statistics_s=statistics)
