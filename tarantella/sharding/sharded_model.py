"""What sharding adds to a data-parallel tnt.Model (shard="optimizer" | "gradients" | "weights" on more than one
rank): the weights each rank holds (stage 3), the optimizer built on this rank's share, and the collective saves
and restores that gather every rank's share on the master or hand each rank its own
(Note [Saving and restoring sharded optimizer state] in checkpoint.py).

tnt.Model (tarantella/keras/model.py) holds one of these when it is sharded, and asks it; the Keras face keeps
no sharding case of its own."""
from __future__ import annotations

import contextlib

import keras

from tarantella import runtime, stage_state
from tarantella.sharding import checkpoint, weight_shards
from tarantella.sharding.update import shard_model_optimizer, shard_optimizer, sharding_of
from tarantella.step import optimizers

__all__ = ["ShardedModel"]


class ShardedModel:
    """The sharded state of `model` (the user's Keras model that tnt.Model wraps) on this rank.

    own_logic: the model has its own training logic (Note [A model's own training logic] in
    tarantella/keras/model.py): its own optimizers are sharded, not the wrapper's."""

    def __init__(self, model: keras.Model, mode: str, own_logic: bool, rank: int, size: int):
        self.model = model
        self.mode = mode
        self.own_logic = own_logic
        # shard="weights": Note [Weights gathered layer by layer] in gathered_weights.py; every rank takes its own
        # weights from the master's while they are sharded, so the model needs no broadcast of them after.
        self.gathering = weight_shards.shard_weights(model, rank, size) if mode == "weights" else None
        self._loaded_optimizer = None     # a built optimizer handed to compile: its state, for the sharded one
        self._master_restores_for_all = False
        self._restored_wholes = []        # own training logic: (optimizer, whole) the master restored for all

    # --- weights ---------------------------------------------------------------

    def whole_weights(self):
        """Every weight of the model on every rank (each from its owner with shard="weights"): a collective."""
        if self.gathering is None:
            return self.model.get_weights()
        return self.gathering.whole_weights(self.model.weights)

    def set_weights(self, weights) -> None:
        """With shard="weights" each rank keeps the values of the weights it owns."""
        if self.gathering is None:
            self.model.set_weights(weights)
            return
        for variable, value in zip(self.model.weights, weights):
            if not stage_state.is_released(variable):
                variable.assign(value)

    def release_unowned_weights(self) -> None:
        """shard="weights": give back the storage of the weights this rank does not own (after a load)."""
        if self.gathering is not None:
            self.gathering.release_unowned()

    # --- the optimizer -----------------------------------------------------------

    def update(self, optimizer):
        """The sharding of tnt.Model's own optimizer (the direct path) once it is built (Note [A sharded update] in
        update.py); None for a model with its own training logic."""
        return None if self.own_logic else sharding_of(optimizer)

    def saves_gathered(self, optimizer) -> bool:
        """Whether saving gathers every rank's optimizer state on the master (a collective)."""
        return self.own_logic or self.update(optimizer) is not None

    def compiled_optimizer(self, optimizer):
        """The optimizer tnt.Model compiles with: a loaded model's optimizer holds every variable's state, so the
        sharded one is a new copy, built on this rank's variables, that takes this rank's part of that state when
        it is built (build_optimizer)."""
        if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
            self._loaded_optimizer, optimizer = optimizer, optimizers.unbuilt_copy(optimizer)
        return optimizer

    def shard_compiled(self, optimizer) -> None:
        """After compile: the direct path's optimizer is built on this rank's share before the first step."""
        shard_model_optimizer(optimizer, mode=self.mode)

    def build_optimizer(self, optimizer, variables) -> None:
        """Collectively, once per compile: build the optimizer on this rank's share of the variables, taking that
        share of a loaded model's state."""
        optimizer.build(variables)
        if self._loaded_optimizer is not None:
            checkpoint.take_share(optimizer, self._loaded_optimizer)
            self._loaded_optimizer = None

    def own_logic_compiled(self) -> None:
        """A loaded model's own optimizers hold the whole state: each rank takes its share once they are built."""
        checkpoint.take_share_when_built(self.model)

    def shard_own(self, optimizer) -> None:
        """One of the model's own optimizers (before it is distributed: the sharded apply below the reduction)."""
        shard_optimizer(optimizer, mode=self.mode)

    # --- saving and restoring --------------------------------------------------------

    def write_gathered(self, optimizer, write) -> None:
        """Collective: every rank's optimizer state (and with shard="weights" every weight) on the master, which
        calls write() alone."""
        with self._whole_weights_on_master(), self._gathered_optimizer_state(optimizer) as writes:
            if writes:
                write()

    def _whole_weights_on_master(self):
        if self.gathering is None:
            return contextlib.nullcontext()
        return self.gathering.whole_on(runtime.get_master_rank())

    def _gathered_optimizer_state(self, optimizer):
        if self.own_logic:   # Note [Saving a model with its own training logic, sharded] in checkpoint.py
            return checkpoint.own_optimizers_gathered_on_master(self.model)
        return checkpoint.gathered_on_master(optimizer, self.update(optimizer).owned, self.model.optimizer,
                                             self.model.trainable_variables)

    def load_weights(self, optimizer, load) -> None:
        """Not a collective: load() reads the file into the model; each rank keeps its own share of the optimizer
        state, unless the master restores for all (master_restores_for_all)."""
        if self.gathering is not None:   # the file holds every weight; this rank keeps its own (below)
            self.gathering.hold_all()
        if self.own_logic:   # Note [Saving a model with its own training logic, sharded]
            pairs = checkpoint.read_own_whole(self.model, load)
            if self._master_restores_for_all:
                self._restored_wholes = pairs
                return
            for own_optimizer, whole in pairs:
                checkpoint.take_share(own_optimizer, whole)
                checkpoint.release(whole)
            self.release_unowned_weights()
            return
        checkpoint.prepare_to_load(self.model.optimizer, self.model.trainable_variables)
        load()
        checkpoint.take_share(optimizer, self.model.optimizer)
        if not self._master_restores_for_all:
            checkpoint.release(self.model.optimizer)
            self.release_unowned_weights()

    @contextlib.contextmanager
    def master_restores_for_all(self):
        """Within, on the master: a restored file's whole optimizer state is kept until share_restored (a
        collective, after) hands every rank its share."""
        self._master_restores_for_all = True
        try:
            yield
        finally:
            self._master_restores_for_all = False

    def share_restored(self, optimizer) -> None:
        """Collective: every rank's share of the master's restored optimizer state (BackupAndRestore)."""
        if not self.own_logic:
            checkpoint.share_from_master(optimizer, self.model.optimizer, self.model.trainable_variables)
            return
        restored, self._restored_wholes = dict((id(o), w) for o, w in self._restored_wholes), []
        for own_optimizer in checkpoint.built_sharded_optimizers(self.model):   # every rank alike
            checkpoint.share_from_master(own_optimizer, restored.get(id(own_optimizer)),
                                         sharding_of(own_optimizer).variables)
