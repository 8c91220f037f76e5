"""Fabric strategies: one device, or DDP over several, on any device type.

The bodies are the shared mixins of :mod:`lightning_anyaccel.strategies.common` (the Trainer
strategies use the same ones); what is here is only what Fabric names differently: its
precision attribute is ``precision``, its DDP hook is ``setup_module`` and its launcher class
is its own.

Checkpoints need nothing here: Fabric's default ``TorchCheckpointIO`` loads every tensor onto
CPU (its ``map_location`` keeps the CPU storage torch deserialised) and ``load_state_dict``
copies it to the device, so ``fabric.load`` already reads checkpoints written on devices this
machine does not have (pinned by ``tests/test_fabric_checks.py``).
"""

from __future__ import annotations

from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel.strategies.common import AnyDistributedMixin, LazyDeviceMixin, SafeLaunchMixin


class AnySingleDeviceStrategy(LazyDeviceMixin, SingleDeviceStrategy):
    """Fabric on one device of the accelerator's type (Fabric alone would pick ``"cpu"``).

    Example:
        >>> from lightning import Fabric
        >>> from lightning_anyaccel.fabric import AnyAccelerator
        >>> fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=AnySingleDeviceStrategy(), devices=1)
        >>> fabric.device
        device(type='cpu')
    """

    strategy_name = "any_single"
    _precision_attr = "precision"


class AnyMultiProcessingLauncher(SafeLaunchMixin, _MultiProcessingLauncher):
    """Fabric's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`."""


class AnyDDPStrategy(AnyDistributedMixin, DDPStrategy):
    """Fabric DDP with the backend, streams, barrier and fork checks of the accelerator's device type.

    Takes every argument of Lightning's Fabric ``DDPStrategy``; ``process_group_backend=None`` chooses
    from the device table, ``start_method`` is ``"popen"`` (default), ``"spawn"`` or ``"fork"``.
    """

    strategy_name = "any_ddp"
    _precision_attr = "precision"
    _launcher_class = AnyMultiProcessingLauncher

    @override
    def setup_environment(self) -> None:
        self._check_accelerator()
        self._align_precision()
        super().setup_environment()
        self._destroy_at_exit()
        self._check_device_precision()

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        device_ids = self._determine_ddp_device_ids()
        return self._wrap_ddp(module, device_ids, lambda: super(AnyDDPStrategy, self).setup_module(module))


__all__ = ["AnyDDPStrategy", "AnyMultiProcessingLauncher", "AnySingleDeviceStrategy"]
