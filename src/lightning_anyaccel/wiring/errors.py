"""The errors of the strategy policy (:mod:`lightning_anyaccel.wiring.policy`), apart so that the modules the
policy reads (:mod:`lightning_anyaccel.wiring.vendor_names`) raise them without importing the policy."""

from __future__ import annotations

from lightning_anyaccel.troubleshooting import LinkedError


class StrategyNotSupportedError(LinkedError, ValueError):
    """A Lightning strategy that can not train on the accelerator's device type."""


class FrontEndMismatchError(LinkedError, TypeError):
    """An object of the package built for ``lightning`` given to ``pytorch_lightning`` (or the reverse)."""


__all__ = ["FrontEndMismatchError", "StrategyNotSupportedError"]
