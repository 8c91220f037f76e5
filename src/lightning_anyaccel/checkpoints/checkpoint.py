"""Checkpoints that load on machines without the device they were saved on.

``torch.load`` restores every tensor onto the device it was saved from; Lightning remaps
only CUDA, MPS and XLA when those are missing. :func:`portable_map_location` remaps any
device type that is not available here to CPU, and the package's strategies use it when
resuming (``trainer.fit(ckpt_path=...)``). :class:`AtomicCheckpointIO`, the strategies'
default, writes checkpoints so that a job killed mid-save keeps its previous one
(:mod:`lightning_anyaccel.checkpoints.atomic_commit`); a broken or foreign checkpoint fails to load with
:class:`CheckpointLoadError`, which says what the file is.

Example:
    >>> import torch
    >>> storage = torch.zeros(1).untyped_storage()
    >>> portable_map_location(storage, "cpu") is None
    True
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from typing_extensions import override

from lightning_anyaccel.checkpoints import atomic_commit
from lightning_anyaccel.checkpoints.atomic_commit import TMP_SUFFIX, CheckpointPath
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec, known_device_types
from lightning_anyaccel.troubleshooting import LinkedError


def portable_map_location(storage: Any, location: str) -> Any:
    """``map_location`` for ``torch.load``: keep tensors on their device if it exists here, else CPU.

    Use it for your own loads, e.g.
    ``MyModel.load_from_checkpoint(path, map_location=portable_map_location)``.
    """
    device_type, _, index = location.partition(":")
    if device_type not in known_device_types():
        return storage.cpu()
    spec = get_spec(device_type)
    return None if spec.host or int(index or 0) < runtime.device_count(spec) else storage.cpu()


class CheckpointSaveError(LinkedError, OSError):
    """A checkpoint could not be written; the previous one at the same path is still there."""


class CheckpointLoadError(LinkedError, RuntimeError):
    """A checkpoint cannot be loaded: truncated, corrupted, or written by another strategy or world size."""


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
    def save_checkpoint(self, checkpoint: dict[str, Any], path: CheckpointPath, storage_options: Any | None = None) -> None:
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
                atomic_commit.commit(tmp, target)
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
        atomic_commit.fsync_dir(target.parent)

    @override
    def load_checkpoint(self, path: CheckpointPath, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Lightning's load; a truncated, corrupted or foreign checkpoint raises :class:`CheckpointLoadError`."""
        if "://" not in str(path):
            path = atomic_commit.recover(path)
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
def load_errors(path: CheckpointPath, strategy: str) -> Iterator[None]:
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


__all__ = ["AtomicCheckpointIO", "CheckpointLoadError", "CheckpointSaveError", "describe_checkpoint", "load_errors",
           "portable_map_location"]
