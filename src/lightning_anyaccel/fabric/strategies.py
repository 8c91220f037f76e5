"""Fabric strategies: one device, or DDP over several, on any device type.

The bodies are the shared mixins of :mod:`lightning_anyaccel.strategies.common` (the Trainer
strategies use the same ones); what is here is only what Fabric names differently: its
precision attribute is ``precision``, its DDP hook is ``setup_module``, its launcher class is
its own, and ``fabric.load`` passes no ``map_location`` (so the default checkpoint IO is the
portable one).
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel.checkpoint import PortableCheckpointIO
from lightning_anyaccel.strategies.common import AnyDistributedMixin, ForkCheckedLaunchMixin, LazyDeviceMixin


class PortableCheckpointMixin:
    """Fabric strategies load checkpoints with tensors of missing devices remapped to CPU.

    A checkpoint IO the user passes (``plugins=`` or ``checkpoint_io=``) is kept as given.
    """

    _checkpoint_io: CheckpointIO | None

    @property
    @override
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = PortableCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io


class AnySingleDeviceStrategy(PortableCheckpointMixin, LazyDeviceMixin, SingleDeviceStrategy):
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


class AnyMultiProcessingLauncher(ForkCheckedLaunchMixin, _MultiProcessingLauncher):
    """Fabric's spawn/fork launcher, refusing a fork after the device was initialised."""


class AnyDDPStrategy(PortableCheckpointMixin, AnyDistributedMixin, DDPStrategy):
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


__all__ = ["AnyDDPStrategy", "AnyMultiProcessingLauncher", "AnySingleDeviceStrategy", "PortableCheckpointMixin"]
