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

import lightning_fabric  # noqa: F401  (a clear ImportError when it is not installed)

from lightning_anyaccel._lightning import PYTORCH_LIGHTNING, port
from lightning_anyaccel.accelerator import AnyAccelerator as _AnyAccelerator
from lightning_anyaccel.wiring import registration

registration.register_fabric(PYTORCH_LIGHTNING)

AnyAccelerator = port(_AnyAccelerator, PYTORCH_LIGHTNING)
#: The package's Fabric-side classes (:func:`~lightning_anyaccel.wiring.registration.fabric_classes`), ported.
globals().update({cls.__name__: port(cls, PYTORCH_LIGHTNING) for cls in registration.fabric_classes()})


def __getattr__(name: str) -> type:
    return registration.ported(__name__, name)


__all__ = sorted(["AnyAccelerator", *(cls.__name__ for cls in registration.fabric_classes())])
