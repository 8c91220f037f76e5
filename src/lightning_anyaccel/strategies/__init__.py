"""Strategies for the Trainer: one device, or DDP over several, on any device type."""

from lightning_anyaccel.strategies.ddp import AnyDDPStrategy
from lightning_anyaccel.strategies.single import AnySingleDeviceStrategy

__all__ = ["AnyDDPStrategy", "AnySingleDeviceStrategy"]
