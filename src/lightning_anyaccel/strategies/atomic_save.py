"""Atomic saves for the sharded strategies (FSDP, FSDP2, DeepSpeed), Trainer and Fabric.

Every rank writes its part of the checkpoint into a sibling of the target; then rank 0 puts it
in the target's place in one step (:func:`lightning_anyaccel.checkpoints.atomic_commit.commit`), so a job
killed at any moment of a save keeps its previous checkpoint. Loads restore a checkpoint a kill
left renamed and report broken or foreign checkpoints clearly
(:func:`lightning_anyaccel.checkpoints.checkpoint.load_errors`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_anyaccel.checkpoints import atomic_commit
from lightning_anyaccel.checkpoints.atomic_commit import DIR_TMP_SUFFIX, CheckpointPath
from lightning_anyaccel.checkpoints.checkpoint import CheckpointSaveError, load_errors

if TYPE_CHECKING:  # each save mixin is mixed in before the strategies of one front end
    from lightning.fabric.strategies import Strategy as _FabricStrategy
    from lightning.pytorch.strategies import Strategy as _TrainerStrategy
else:
    _TrainerStrategy = _FabricStrategy = object


def save_atomically(strategy: Any, path: CheckpointPath, write: Callable[[Path], None]) -> None:
    """Run a checkpoint save that every rank takes part in, so that it replaces ``path`` atomically.

    ``write(staged)`` is the strategy's own save, pointed at a sibling ``.<name>.anyaccel-tmp``.
    After every rank wrote its part, rank 0 flushes the files and :func:`commit`\\ s them over
    ``path``. A kill at any moment leaves the previous checkpoint complete at ``path``; a write
    error on any rank (a full disk) fails the save on every rank with :class:`CheckpointSaveError`
    and keeps it too. Call it on every rank, like the save itself.
    """
    target = Path(strategy.broadcast(str(path)))
    staged = atomic_commit.sibling(target, DIR_TMP_SUFFIX)
    if strategy.is_global_zero:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_commit.remove(staged)  # leftovers of a save that was killed
    strategy.barrier()
    error: BaseException | None = None
    try:
        write(staged)
    except Exception as exc:  # every rank must learn of it, or the others wait in the next collective
        error = exc
    all_ok = strategy.reduce_boolean_decision(error is None, all=True)
    if not all_ok:
        if strategy.is_global_zero:
            atomic_commit.remove(staged)
        strategy.barrier()
        where = f"rank {strategy.global_rank}: {type(error).__name__}: {error}" if error else "another rank failed"
        raise CheckpointSaveError(
            f"Could not write the checkpoint {target} ({where}). The previous checkpoint at that path, if any,"
            " is unchanged. Free disk space or fix the path, then save again."
        ) from error
    if strategy.is_global_zero:
        atomic_commit.fsync_tree(staged)
        atomic_commit.commit(staged, target)
    strategy.barrier()


class AtomicSaveMixin(_TrainerStrategy):
    """For the Trainer's sharded strategies (FSDP, FSDP2, DeepSpeed): atomic saves, clear load errors.

    Mixed in first, before the package's strategy mixin: ``save_checkpoint`` runs the strategy's
    own save through :func:`save_atomically`; ``load_checkpoint`` restores a checkpoint a kill left
    renamed (:func:`recover`) and reports broken or foreign checkpoints with :func:`load_errors`.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: CheckpointPath, storage_options: Any | None = None) -> None:
        parent_save = super().save_checkpoint

        def write(staged: Path) -> None:
            parent_save(checkpoint, staged, storage_options)

        save_atomically(self, filepath, write)

    @override
    def load_checkpoint(self, checkpoint_path: CheckpointPath, *args: Any, **kwargs: Any) -> dict[str, Any]:
        path = _recover_on_rank_zero(self, checkpoint_path)
        with load_errors(path, type(self).__name__):
            return super().load_checkpoint(path, *args, **kwargs)


class FabricAtomicSaveMixin(_FabricStrategy):
    """:class:`AtomicSaveMixin` for Fabric's sharded strategies (Fabric's argument order)."""

    @override
    def save_checkpoint(self, path: CheckpointPath, state: dict[str, Any], storage_options: Any | None = None,
                        filter: dict[str, Callable[[str, Any], bool]] | None = None) -> None:
        parent_save = super().save_checkpoint

        def write(staged: Path) -> None:
            parent_save(staged, state, storage_options=storage_options, filter=filter)

        save_atomically(self, path, write)

    @override
    def load_checkpoint(self, path: CheckpointPath, *args: Any, **kwargs: Any) -> Any:
        path = _recover_on_rank_zero(self, path)
        with load_errors(path, type(self).__name__):
            return super().load_checkpoint(path, *args, **kwargs)


def _recover_on_rank_zero(strategy: Any, path: CheckpointPath) -> Path:
    target = Path(strategy.broadcast(str(path)))
    if strategy.is_global_zero:
        atomic_commit.recover(target)
    strategy.barrier()
    return target


__all__ = ["AtomicSaveMixin", "FabricAtomicSaveMixin", "save_atomically"]
