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

import pytorch_lightning  # noqa: F401  (a clear ImportError when it is not installed)

from lightning_anyaccel._lightning import PYTORCH_LIGHTNING, port
from lightning_anyaccel.wiring import registration

registration.register_trainer(PYTORCH_LIGHTNING)

#: The package's Trainer-side classes (:func:`~lightning_anyaccel.wiring.registration.trainer_classes`), ported.
globals().update({cls.__name__: port(cls, PYTORCH_LIGHTNING) for cls in registration.trainer_classes()})


def __getattr__(name: str) -> type:
    return registration.ported(__name__, name)


__all__ = sorted(cls.__name__ for cls in registration.trainer_classes())
