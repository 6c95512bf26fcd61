"""The user's unpartitioned model across the stages: whose weights live where, and gathering them.

Every rank builds the whole model, then keeps only its stage's weights (the others are released: Note
[Releasing a variable] in tarantella/stage_state.py; a model built in tnt.deferred_weights() never gives the others
storage: Note [Models built without storage] in tarantella/deferred_build.py). This class answers for the
whole model: every rank starts from the master's weights, any rank can get all weights (a collective),
and the master can be given every stage's weights and optimizer state to write one ordinary `.keras`
file (gather on save), which every rank reads back keeping its own stage's part (scatter on load).
"""
from __future__ import annotations

import keras
import numpy as np

from tarantella import collectives, deferred_build, runtime, stage_state
from tarantella.pipelining.partition import Partition
from tarantella.pipelining.topology import Placement
from tarantella.step import initial_weights

__all__ = ["WholeModel"]


class WholeModel:
    """`model`, cut by `partition`, of which this rank (`placement`) holds one stage."""

    def __init__(self, model: keras.Model, partition: Partition, placement: Placement):
        self.model = model
        self.partition = partition
        self.placement = placement

    def check_same_partition(self) -> None:
        """Collective: every rank must cut the same model the same way (edge ids are message tags)."""
        if runtime.get_size() == 1:
            return
        mine = [(e.source, e.target, e.shape, e.dtype) for e in self.partition.edges]
        everyone = collectives.allgather_object(mine)
        differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
        if differ:
            raise ValueError(f"tarantella: ranks {differ} cut the model differently from rank 0 "
                             f"(rank 0: {everyone[0]}; rank {differ[0]}: {everyone[differ[0]]}); every rank must "
                             f"build the same model with the same SplitLayers")

    def stage_variables(self, stage: int) -> list:
        """Variables of `stage`, known on every rank: the weights of the layers the stage runs."""
        names = set(self.partition.stages[stage].layer_names)
        return [w for op in self.model.operations if op.name in names for w in getattr(op, "weights", [])]

    def owner_ranks(self) -> list[int]:
        """Per variable of the whole model (in model.weights order): the rank of replica 0 holding it."""
        owner = {id(v): s for s in range(self.placement.num_stages) for v in self.stage_variables(s)}
        return [self.placement.rank_of(0, owner.get(id(v), 0)) for v in self.model.weights]

    def start_weights(self) -> None:
        """Collective: every rank starts from the master's initial weights and holds only its stage's.
        A model built in tnt.deferred_weights() gets storage for this stage's weights only, drawn with
        the master's seeds (Note [Models built without storage] in tarantella/deferred_build.py); weights
        built eagerly come from the master, then the other stages' are released."""
        deferred = [v for v in self.model.variables if deferred_build.is_deferred(v)]
        deferred_build.take_master_seeds(deferred)
        others = {id(v) for v in self._other_stages_weights()}
        for variable in deferred:
            if id(variable) not in others:  # this stage's, or state every rank keeps (a random layer's seeds)
                deferred_build.initialize(variable)
        if runtime.get_size() > 1:   # the weights built eagerly, the same variables on every rank
            drawn = {id(v) for v in deferred}
            initial_weights.broadcast_into([v for v in self.model.weights if id(v) not in drawn])
        self.release_other_stages()  # the other stages' deferred weights too: they never get storage

    def release_other_stages(self) -> None:
        """Keep only this stage's weights (Note [Releasing a variable] in tarantella/stage_state.py)."""
        for variable in self._other_stages_weights():
            stage_state.release(variable)

    def _other_stages_weights(self) -> list:
        if self.placement.num_stages == 1:
            return []
        mine = {id(v) for v in self.stage_variables(self.placement.stage)}
        return [v for v in self.model.weights if id(v) not in mine]

    def sync_weights(self) -> list[np.ndarray]:
        """Collective: the whole model's current weights (every stage's), on every rank, as arrays."""
        weights, owners, rank = self.model.weights, self.owner_ranks(), runtime.get_rank()
        if runtime.get_size() == 1:
            return [np.array(v.numpy()) for v in weights]
        values = []
        for variable, owner in zip(weights, owners):
            buffer = (np.array(variable.numpy(), copy=True) if rank == owner
                      else np.empty(tuple(variable.shape), variable.dtype))
            values.append(collectives.broadcast(buffer, root=owner))
        return values

    def save_gathered(self, write, stage_optimizer=None, stage_model=None) -> None:
        """Collective: the master writes the whole model with `write` (gather on save); with
        `stage_optimizer`, the whole model's optimizer gets every stage's state first."""
        if runtime.get_size() == 1:
            write()
            return
        materialized = self._gather_on_master()
        if stage_optimizer is not None:
            materialized += self._gather_optimizer_on_master(stage_optimizer, stage_model)
        try:
            if runtime.is_master_rank():
                write()
        finally:
            for variable in materialized:
                stage_state.release(variable)
            collectives.barrier()

    def load_weights(self, filepath, *args, **kwargs) -> None:
        """Every rank reads the whole model's weights and keeps its stage's (scatter on load)."""
        for variable in self.model.weights:
            if stage_state.is_released(variable):
                stage_state.materialize(variable, np.zeros(tuple(variable.shape), variable.dtype))
        self.model.load_weights(filepath, *args, **kwargs)
        self.release_other_stages()

    def _gather_on_master(self) -> list:
        """Collective: the master's whole model gets every stage's current weights; returns the variables
        given storage for them, to release after."""
        master, rank = runtime.get_master_rank(), runtime.get_rank()
        weights, owners = self.model.weights, self.owner_ranks()
        keys = list(range(len(weights)))
        specs = {k: (tuple(v.shape), v.dtype) for k, v in enumerate(weights)}
        gathered = stage_state.gather_to_root({k: v.numpy() for k, v in enumerate(weights) if owners[k] == rank},
                                              keys, specs, dict(enumerate(owners)), master, rank)
        materialized = []
        if rank == master:
            for k, variable in enumerate(weights):
                if stage_state.is_released(variable):
                    materialized.append(variable)
                stage_state.materialize(variable, gathered[k])
        return materialized

    def _gather_optimizer_on_master(self, stage_optimizer, stage_model) -> list:
        """Collective: the master's whole-model optimizer gets every stage's optimizer state (replica 0's ranks
        come first, so a stage's state is taken from its replica 0; a slot of an optimizer sharded over the
        replicas from the replica that holds it)."""
        return stage_state.gather_optimizer_on_master(stage_optimizer, stage_model.trainable_variables,
                                                      self.model.optimizer, self.model.trainable_variables)
