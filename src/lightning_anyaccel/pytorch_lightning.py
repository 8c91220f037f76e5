"""The package for ``import pytorch_lightning as pl``: the same classes, built on ``pytorch_lightning``.

Lightning is published as ``lightning`` and as ``pytorch_lightning``; their classes do not mix, so
the package builds its classes once more on ``pytorch_lightning``'s bases, with the same code
(:func:`lightning_anyaccel._lightning.port`). The registered names need no import from here:
``import lightning_anyaccel`` registers them with ``pytorch_lightning`` too, in either import order.

Example:
    >>> import pytorch_lightning as pl
    >>> import lightning_anyaccel
    >>> trainer = pl.Trainer(accelerator="any", strategy="any_single", devices=1, logger=False)
    >>> type(trainer.strategy).__module__
    'lightning_anyaccel.pytorch_lightning'
    >>> from lightning_anyaccel.pytorch_lightning import AnyAccelerator, AnyDDPStrategy
    >>> trainer = pl.Trainer(accelerator=AnyAccelerator("cpu"), strategy=AnyDDPStrategy(), devices=2, logger=False)
    >>> trainer.strategy.num_processes
    2
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytorch_lightning  # noqa: F401  (a clear ImportError when it is not installed)

from lightning_anyaccel import registration
from lightning_anyaccel._lightning import PYTORCH_LIGHTNING, port

registration.register_trainer(PYTORCH_LIGHTNING)

if TYPE_CHECKING:  # the same classes as for `lightning`, as far as a type checker is concerned
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO
    from lightning_anyaccel.checkpoints.preemption import PreemptionCheckpoint
    from lightning_anyaccel.cluster.environments import AnyMPIEnvironment
    from lightning_anyaccel.device.sharded_precision import AnyFSDPPrecision
    from lightning_anyaccel.strategies import (
        AnyDDPStrategy,
        AnyDeepSpeedStrategy,
        AnyFSDPStrategy,
        AnyModelParallelStrategy,
        AnySingleDeviceStrategy,
    )
else:
    globals().update({cls.__name__: port(cls, PYTORCH_LIGHTNING) for cls in registration.trainer_classes()})


def __getattr__(name: str) -> type:
    return registration.ported(__name__, name)


__all__ = [
    "AnyAccelerator",
    "AnyDDPStrategy",
    "AnyDeepSpeedStrategy",
    "AnyFSDPPrecision",
    "AnyFSDPStrategy",
    "AnyMPIEnvironment",
    "AnyModelParallelStrategy",
    "AnySingleDeviceStrategy",
    "AtomicCheckpointIO",
    "PreemptionCheckpoint",
]
