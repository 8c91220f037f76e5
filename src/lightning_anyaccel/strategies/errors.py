"""The errors the package's strategies raise for a setup that can not work (each links to its troubleshooting entry)."""

from __future__ import annotations

from lightning.fabric.utilities.exceptions import MisconfigurationException

from lightning_anyaccel.troubleshooting import LinkedError


class NotebookLaunchError(LinkedError, MisconfigurationException, RuntimeError):
    """A start method that can not work from a notebook / interactive session (or this platform)."""


class ShardingNotSupportedError(LinkedError, ValueError):
    """The sharded strategy cannot run with this device or these options."""


class DeepSpeedNotInstalledError(LinkedError, ImportError):
    """The ``deepspeed`` package is not installed."""


__all__ = ["DeepSpeedNotInstalledError", "NotebookLaunchError", "ShardingNotSupportedError"]
