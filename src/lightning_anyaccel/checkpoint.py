"""Checkpoints that load on machines without the device they were saved on.

``torch.load`` restores every tensor onto the device it was saved from; Lightning remaps
only CUDA, MPS and XLA when those are missing. :func:`portable_map_location` remaps any
device type that is not available here to CPU, and the package's strategies use it when
resuming (``trainer.fit(ckpt_path=...)``).

Example:
    >>> import torch
    >>> storage = torch.zeros(1).untyped_storage()
    >>> portable_map_location(storage, "cpu") is None
    True
"""

from __future__ import annotations

from typing import Any

from lightning_anyaccel import runtime
from lightning_anyaccel.devices import DEVICE_TABLE


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
