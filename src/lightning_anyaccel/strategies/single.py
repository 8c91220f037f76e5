"""``AnySingleDeviceStrategy``: train on one device of any type.

Lightning's connector gives any accelerator other than CUDA/MPS a ``SingleDeviceStrategy("cpu")``
when one device is requested, so the model silently trains on CPU. This strategy takes its
device from the accelerator instead (``devices=[1]`` -> ``xpu:1``).

Example:
    >>> from lightning import Trainer
    >>> from lightning_anyaccel import AnyAccelerator
    >>> trainer = Trainer(accelerator=AnyAccelerator("cpu"), strategy="any_single", devices=1, logger=False)
    >>> trainer.strategy.root_device
    device(type='cpu')
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_anyaccel.strategies.common import AnyStrategyMixin


class AnySingleDeviceStrategy(AnyStrategyMixin, SingleDeviceStrategy):
    """One process, one device; the device comes from the accelerator unless given.

    Args:
        device: a device such as ``"xpu:1"``; ``None`` (default) takes the device selected by
            the Trainer's ``accelerator`` and ``devices``.
        accelerator, checkpoint_io, precision_plugin: as for Lightning's ``SingleDeviceStrategy``.
    """

    strategy_name = "any_single"

    def __init__(self, device: str | torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(device="cpu", **kwargs)
        self._root_device: torch.device | None = torch.device(device) if device is not None else None  # type: ignore[assignment]

    @property
    @override
    def root_device(self) -> torch.device:
        if self._root_device is None:
            device_type = getattr(self.accelerator, "device_type", None)
            if device_type is None:
                raise MisconfigurationException(
                    "AnySingleDeviceStrategy() has no device yet: pass it to a Trainer with an accelerator,"
                    " or give one, e.g. AnySingleDeviceStrategy('xpu:0')."
                )
            return torch.device(device_type, 0) if device_type != "cpu" else torch.device("cpu")
        return self._root_device

    @property
    def parallel_devices(self) -> list[torch.device]:
        """The one device, as a list: lets Lightning's connector hand over the selected device."""
        return [self._root_device] if self._root_device is not None else []

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        if len(devices) != 1:
            raise MisconfigurationException(
                f"strategy='any_single' trains on one device, but devices= selected {len(devices)}: {devices}."
                " Use devices=1, or strategy='any_ddp' for several devices."
            )
        self._root_device = devices[0]

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        self._validate_device_setup()

    @override
    def setup_environment(self) -> None:
        self._validate_device_setup()
        super().setup_environment()

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return self._load_portable(super().load_checkpoint, checkpoint_path, weights_only=weights_only)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="One device of the accelerator's type", override=True
        )
