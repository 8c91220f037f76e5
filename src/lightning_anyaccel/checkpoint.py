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

import os
from pathlib import Path
from typing import Any, BinaryIO, Union

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from typing_extensions import override

from lightning_anyaccel import runtime
from lightning_anyaccel.devices import DEVICE_TABLE

_PATH = Union[str, os.PathLike]  # what Lightning's checkpoint IO accepts as a path


def portable_map_location(storage: Any, location: str) -> Any:
    """``map_location`` for ``torch.load``: keep tensors on their device if it exists here, else CPU.

    Use it for your own loads, e.g.
    ``MyModel.load_from_checkpoint(path, map_location=portable_map_location)``.
    """
    device_type, _, index = location.partition(":")
    if device_type == "cpu":
        return None
    if device_type in DEVICE_TABLE and int(index or 0) < runtime.device_count(device_type):
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
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def _write(self, checkpoint: dict[str, Any], file: BinaryIO) -> None:
        """Serialise ``checkpoint`` into the open temporary file (a hook for other formats)."""
        torch.save(checkpoint, file)


def _fsync_dir(directory: Path) -> None:
    """Persist a rename on file systems that need the directory synced (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
