"""How tnt.Model (model.py) saves and loads: the master rank writes the wrapped model as a plain Keras file (every
rank with --output-on-all-devices), atomically (write_aside); a sharded model's saves and restores are
collectives that gather every rank's share on the master or hand each rank its own
(tarantella/sharding/sharded_model.py, Note [Saving and restoring sharded optimizer state] in
tarantella/sharding/checkpoint.py)."""
from __future__ import annotations

import contextlib
import os

from tarantella import runtime
from tarantella.step import rank_callbacks

__all__ = ["ModelFiles", "write_aside"]

_ATOMIC_SUFFIXES = (".keras", ".weights.h5")


class ModelFiles:
    """Mixed into tnt.Model before keras.Model; needs self._model (the wrapped model), self._sharding (None unless
    sharded) and self.optimizer once compiled."""

    def save(self, filepath, overwrite=True, **kwargs):
        """The master rank writes the wrapped model as a plain `.keras` file; other ranks do nothing
        (every rank writes with --output-on-all-devices, like the output callbacks). Not a collective,
        except with shard="optimizer": then every rank must call it, the master gathers every rank's optimizer
        state and writes the file alone. Load it with keras.saving.load_model or tnt.models.load_model."""
        self._save(self._model.save, filepath, overwrite, **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """As save: the master writes (every rank with --output-on-all-devices); with shard="optimizer" a
        collective, the master writes alone."""
        self._save(self._model.save_weights, filepath, overwrite, **kwargs)

    def _save(self, save, filepath, overwrite, **kwargs) -> None:
        def write():
            write_aside(save, filepath, overwrite, runtime.get_rank(), **kwargs)
        if self.is_sharded:  # Note [Saving and restoring sharded optimizer state]
            self._sharding.write_gathered(self.optimizer, write)
        elif rank_callbacks.output_on_this_rank():
            write()

    def load_weights(self, filepath, *args, **kwargs):
        """Not a collective. With shard="optimizer" each rank that reads the file keeps its own share of the
        optimizer state (Note [Saving and restoring sharded optimizer state])."""
        def load():
            self._model.load_weights(filepath, *args, **kwargs)
        if self.is_sharded:
            self._sharding.load_weights(self.optimizer, load)
        else:
            load()

    def release_unowned_weights(self) -> None:
        """shard="weights": give back the storage of the weights this rank does not own (after a load)."""
        if self._sharding is not None:
            self._sharding.release_unowned_weights()

    @property
    def is_sharded(self) -> bool:
        """Whether this rank keeps only its share of the optimizer state (shard=..., set up by fit; a model with its
        own training logic: its optimizers, once built); saving and restoring are collectives then."""
        return self._sharding is not None and self._sharding.saves_gathered(getattr(self, "optimizer", None))

    def master_restores_for_all(self):
        """Within, on the master: a restored file's whole optimizer state is kept until
        `share_restored_optimizer_state` (a collective, after) hands every rank its share."""
        return self._sharding.master_restores_for_all() if self._sharding else contextlib.nullcontext()

    def share_restored_optimizer_state(self) -> None:
        """Collective: every rank's share of the master's restored optimizer state (BackupAndRestore)."""
        if self._sharding is not None:
            self._sharding.share_restored(self.optimizer)


def write_aside(save, filepath, overwrite: bool, rank: int, **kwargs) -> None:
    """save(filepath, overwrite=..., **kwargs) (a Keras model's save or save_weights); a `.keras` or `.weights.h5`
    path that may be overwritten is written aside, then renamed: ranks that write one path together (with
    --output-on-all-devices; HDF5 would refuse the second writer's lock), and readers, never see half a file."""
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    suffix = next((s for s in _ATOMIC_SUFFIXES if path is not None and path.endswith(s)), None)
    if suffix is None or not overwrite:
        save(filepath, overwrite=overwrite, **kwargs)
        return
    directory, name = os.path.split(os.path.abspath(path))
    scratch = os.path.join(directory, f".{name}.rank{rank}.tmp{suffix}")
    save(scratch, overwrite=True, **kwargs)
    os.replace(scratch, path)
