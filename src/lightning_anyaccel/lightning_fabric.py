"""The package's Fabric classes for the stand-alone ``lightning_fabric`` (``from lightning_fabric import Fabric``).

The same classes as :mod:`lightning_anyaccel.fabric`, built on ``lightning_fabric``'s bases with the
same code (:func:`lightning_anyaccel._lightning.port`). The accelerator is the Trainer's of
:mod:`lightning_anyaccel.pytorch_lightning`, as in Lightning itself.

Example:
    >>> from lightning_fabric import Fabric
    >>> from lightning_anyaccel.lightning_fabric import AnyAccelerator, AnyDDPStrategy
    >>> fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=AnyDDPStrategy(), devices=2)
    >>> type(fabric.strategy).__module__, fabric.strategy.num_processes
    ('lightning_anyaccel.lightning_fabric', 2)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning_fabric  # noqa: F401  (a clear ImportError when it is not installed)

from lightning_anyaccel import registration
from lightning_anyaccel._lightning import PYTORCH_LIGHTNING, port

registration.register_fabric(PYTORCH_LIGHTNING)

if TYPE_CHECKING:
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.device.sharded_precision import AnyFabricFSDPPrecision
    from lightning_anyaccel.fabric.strategies import (
        AnyDDPStrategy,
        AnyDeepSpeedStrategy,
        AnyFSDPStrategy,
        AnyModelParallelStrategy,
        AnySingleDeviceStrategy,
    )
else:
    from lightning_anyaccel.accelerator import AnyAccelerator as _AnyAccelerator

    AnyAccelerator = port(_AnyAccelerator, PYTORCH_LIGHTNING)
    globals().update({cls.__name__: port(cls, PYTORCH_LIGHTNING) for cls in registration.fabric_classes()})


def __getattr__(name: str) -> type:
    return registration.ported(__name__, name)


__all__ = [
    "AnyAccelerator",
    "AnyDDPStrategy",
    "AnyDeepSpeedStrategy",
    "AnyFSDPStrategy",
    "AnyFabricFSDPPrecision",
    "AnyModelParallelStrategy",
    "AnySingleDeviceStrategy",
]
