"""Checkpoints that load on machines without the device they were saved on.

``torch.load`` restores every tensor onto the device it was saved from; Lightning remaps
only CUDA, MPS and XLA when those are missing. :func:`portable_map_location` remaps any
device type that is not available here to CPU, and the package's strategies use it when
resuming (``trainer.fit(ckpt_path=...)``). :class:`AtomicCheckpointIO`, the strategies'
default, writes checkpoints so that a job killed mid-save keeps its previous one.

Example:
    >>> import torch
    >>> storage = torch.zeros(1).untyped_storage()
    >>> portable_map_location(storage, "cpu") is None
    True
"""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Union

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from typing_extensions import override

from lightning_anyaccel import runtime
from lightning_anyaccel.devices import is_host, known_device_types
from lightning_anyaccel.troubleshooting import LinkedError

_PATH = Union[str, Path]  # what Lightning's checkpoint IO accepts as a path (its own `_PATH`)

if TYPE_CHECKING:  # each save mixin is mixed in before the strategies of one front end
    from lightning.fabric.strategies import Strategy as _FabricStrategy
    from lightning.pytorch.strategies import Strategy as _TrainerStrategy
else:
    _TrainerStrategy = _FabricStrategy = object


def portable_map_location(storage: Any, location: str) -> Any:
    """``map_location`` for ``torch.load``: keep tensors on their device if it exists here, else CPU.

    Use it for your own loads, e.g.
    ``MyModel.load_from_checkpoint(path, map_location=portable_map_location)``.
    """
    device_type, _, index = location.partition(":")
    if is_host(device_type):
        return None
    if device_type in known_device_types() and int(index or 0) < runtime.device_count(device_type):
        return None
    return storage.cpu()


#: Suffix of the temporary file a checkpoint is written to before it replaces the target.
TMP_SUFFIX = ".anyaccel-tmp"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic: a checkpoint is complete or absent.

    Lightning writes the final path through an fsspec transaction whose temporary file may live
    on another file system (the final move is then a copy) and is never fsynced. Here the
    checkpoint goes to ``.<name>.<pid>.anyaccel-tmp`` next to the target, is flushed to disk,
    and then ``os.replace``d over the target (atomic on POSIX and Windows). A job killed
    mid-save leaves the previous file untouched; leftovers of such saves are removed by the
    next save of the same file. Remote paths (``s3://`` ...) use Lightning's own writer.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{target.name}.*{TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as file:
                self._write(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            if target.is_dir() and not target.is_symlink():  # a sharded checkpoint of the same name
                commit(tmp, target)
            else:
                os.replace(tmp, target)
        except (OSError, RuntimeError) as exc:
            cause = _os_error(exc)
            if cause is None:
                raise
            raise CheckpointSaveError(
                f"Could not write the checkpoint {target}: {cause.strerror or cause}. The previous checkpoint at that"
                " path, if any, is unchanged. Free disk space or fix the path, then save again."
            ) from exc
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    @override
    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Lightning's load; a truncated, corrupted or foreign checkpoint raises :class:`CheckpointLoadError`."""
        if "://" not in str(path):
            path = recover(path)
            if Path(path).is_dir():
                with load_errors(path, "a single-file checkpoint loader"):
                    raise IsADirectoryError("expected a file written by torch.save")
        with load_errors(path, "a single-file checkpoint loader"):
            return super().load_checkpoint(path, *args, **kwargs)

    def _write(self, checkpoint: dict[str, Any], file: BinaryIO) -> None:
        """Serialise ``checkpoint`` into the open temporary file (a hook for other formats)."""
        torch.save(checkpoint, file)


def _os_error(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` behind ``exc`` (torch's writer turns a full disk into a ``RuntimeError``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _fsync(path: Path) -> None:
    """Flush a file, or a directory's entries, to disk (best effort: some file systems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    """Persist a rename on file systems that need the directory synced (best effort)."""
    _fsync(directory)


# ----- checkpoints written by every rank (sharded directories) -----------------------------------

#: Suffix of the sibling a sharded checkpoint is written into before it takes the target's place.
DIR_TMP_SUFFIX = ".anyaccel-tmp"
#: Suffix of the previous checkpoint while the new one takes its place (only where the file system
#: cannot exchange two names atomically); :func:`recover` puts it back after a kill.
OLD_SUFFIX = ".anyaccel-old"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class CheckpointSaveError(LinkedError, OSError):
    """A checkpoint could not be written; the previous one at the same path is still there."""


class CheckpointLoadError(LinkedError, RuntimeError):
    """A checkpoint cannot be loaded: truncated, corrupted, or written by another strategy or world size."""


def _sibling(target: Path, suffix: str) -> Path:
    return target.with_name(f".{target.name}{suffix}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk (best effort)."""
    if root.is_file():
        paths = [root]
    else:
        paths = [p for p in root.rglob("*") if p.is_file()]
    for path in paths:
        _fsync(path)
    for directory in {p.parent for p in paths} | {root.parent}:
        _fsync_dir(directory)


def commit(staged: Path, target: Path) -> None:
    """Put the complete checkpoint ``staged`` (file or directory) at ``target``, atomically.

    The previous checkpoint at ``target`` stays loadable at every moment: the two names are
    exchanged in one step where the file system can (Linux, local file systems), else the old
    one is first renamed to ``.<name>.anyaccel-old``, which :func:`recover` restores after a kill.
    """
    if not (target.exists() or target.is_symlink()):
        os.rename(staged, target)
    elif _exchange(staged, target):
        _remove(staged)  # now the previous checkpoint
    else:
        old = _sibling(target, OLD_SUFFIX)
        _remove(old)
        os.rename(target, old)
        os.rename(staged, target)
        _remove(old)
    _fsync_dir(target.parent)


def recover(path: _PATH) -> Path:
    """``path``; if a kill hit between the two renames of :func:`commit`, first put the previous checkpoint back."""
    target = Path(path)
    old = _sibling(target, OLD_SUFFIX)
    if not target.exists() and old.exists():
        os.rename(old, target)
    return target


def save_atomically(strategy: Any, path: _PATH, write: Callable[[Path], None]) -> None:
    """Run a checkpoint save that every rank takes part in, so that it replaces ``path`` atomically.

    ``write(staged)`` is the strategy's own save, pointed at a sibling ``.<name>.anyaccel-tmp``.
    After every rank wrote its part, rank 0 flushes the files and :func:`commit`\\ s them over
    ``path``. A kill at any moment leaves the previous checkpoint complete at ``path``; a write
    error on any rank (a full disk) fails the save on every rank with :class:`CheckpointSaveError`
    and keeps it too. Call it on every rank, like the save itself.
    """
    target = Path(strategy.broadcast(str(path)))
    staged = _sibling(target, DIR_TMP_SUFFIX)
    if strategy.is_global_zero:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove(staged)  # leftovers of a save that was killed
    strategy.barrier()
    error: BaseException | None = None
    try:
        write(staged)
    except Exception as exc:  # every rank must learn of it, or the others wait in the next collective
        error = exc
    all_ok = strategy.reduce_boolean_decision(error is None, all=True)
    if not all_ok:
        if strategy.is_global_zero:
            _remove(staged)
        strategy.barrier()
        where = f"rank {strategy.global_rank}: {type(error).__name__}: {error}" if error else "another rank failed"
        raise CheckpointSaveError(
            f"Could not write the checkpoint {target} ({where}). The previous checkpoint at that path, if any,"
            " is unchanged. Free disk space or fix the path, then save again."
        ) from error
    if strategy.is_global_zero:
        _fsync_tree(staged)
        commit(staged, target)
    strategy.barrier()


def describe_checkpoint(path: Path) -> str:
    """What is at ``path``, for error messages: which format, written by which strategy family."""
    if not path.exists():
        return "nothing (the path does not exist)"
    if path.is_file():
        return "a single-file checkpoint (DDP / single device / FSDP full state dict)"
    names = {p.name for p in path.iterdir()}
    if "latest" in names or any((path / n).is_dir() and any((path / n).glob("*model_states.pt")) for n in names):
        return "a DeepSpeed checkpoint directory"
    if ".metadata" in names:
        return "a torch distributed-checkpoint directory (FSDP sharded / FSDP2)"
    return f"a directory that is no checkpoint format the strategies write (contains {sorted(names)[:5]})"


@contextmanager
def load_errors(path: _PATH, strategy: str) -> Iterator[None]:
    """Turn what a broken or foreign checkpoint raises deep in torch/pickle into one clear error.

    The message names the file, what it contains (:func:`describe_checkpoint`), the strategy
    loading it and the original problem.
    """
    try:
        yield
    except CheckpointLoadError:
        raise
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, EOFError, pickle.UnpicklingError,
            RuntimeError, ValueError, KeyError, OSError, AssertionError, TypeError) as exc:
        target = Path(path)
        problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (EOFError, pickle.UnpicklingError)) or "PytorchStreamReader" in problem:
            problem = f"the file is truncated or corrupted ({problem})"
        raise CheckpointLoadError(
            f"Cannot load the checkpoint {target} with {strategy}: {problem}. It is {describe_checkpoint(target)}."
            " Load a checkpoint written by the same kind of strategy (and, for DeepSpeed, the same number of"
            " processes), or an earlier one from the same directory."
        ) from exc


class AtomicSaveMixin(_TrainerStrategy):
    """For the Trainer's sharded strategies (FSDP, FSDP2, DeepSpeed): atomic saves, clear load errors.

    Mixed in first, before the package's strategy mixin: ``save_checkpoint`` runs the strategy's
    own save through :func:`save_atomically`; ``load_checkpoint`` restores a checkpoint a kill left
    renamed (:func:`recover`) and reports broken or foreign checkpoints with :func:`load_errors`.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        parent_save = super().save_checkpoint

        def write(staged: Path) -> None:
            parent_save(checkpoint, staged, storage_options)

        save_atomically(self, filepath, write)

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        path = _recover_on_rank_zero(self, checkpoint_path)
        with load_errors(path, type(self).__name__):
            return super().load_checkpoint(path, *args, **kwargs)


class FabricAtomicSaveMixin(_FabricStrategy):
    """:class:`AtomicSaveMixin` for Fabric's sharded strategies (Fabric's argument order)."""

    @override
    def save_checkpoint(self, path: _PATH, state: dict[str, Any], storage_options: Any | None = None,
                        filter: dict[str, Callable[[str, Any], bool]] | None = None) -> None:
        parent_save = super().save_checkpoint

        def write(staged: Path) -> None:
            parent_save(staged, state, storage_options=storage_options, filter=filter)

        save_atomically(self, path, write)

    @override
    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> Any:
        path = _recover_on_rank_zero(self, path)
        with load_errors(path, type(self).__name__):
            return super().load_checkpoint(path, *args, **kwargs)


def _recover_on_rank_zero(strategy: Any, path: _PATH) -> Path:
    target = Path(strategy.broadcast(str(path)))
    if strategy.is_global_zero:
        recover(target)
    strategy.barrier()
    return target
