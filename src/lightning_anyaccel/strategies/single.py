"""The single-device family: one process, one device of any type, for the Trainer and for Fabric.

Lightning's connectors give any accelerator other than CUDA/MPS a ``SingleDeviceStrategy("cpu")``
when one device is requested, so the model silently trains on CPU. These strategies take their
device from the accelerator instead (``devices=[1]`` -> ``xpu:1``): :class:`LazyDeviceMixin`,
under the Trainer's :class:`AnySingleDeviceStrategy` and Fabric's
(``lightning_anyaccel.fabric.AnySingleDeviceStrategy``). Registered as ``any_single``.

Setup (:data:`SETUP`, run by :func:`~lightning_anyaccel.strategies.steps.run_setup`): the
accelerator's device type and the precision plugin are checked in the launching process and in
the worker; then Lightning's setup selects the device, which is asked whether it can do the precision, and
the stall watchdog starts (:mod:`~lightning_anyaccel.cluster.watchdog`: a run that makes no progress for
``stall_timeout`` seconds prints its stack and ends with status 4).

Example:
    >>> from lightning import Trainer
    >>> from lightning_anyaccel import AnyAccelerator
    >>> trainer = Trainer(accelerator=AnyAccelerator("cpu"), strategy="any_single", devices=1, logger=False)
    >>> trainer.strategy.root_device
    device(type='cpu')
    >>> [step.name for step in SETUP]
    ['check_accelerator', 'align_precision', 'lightning_setup', 'check_device_precision', 'watch_stalls_alone']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.fabric.strategies import SingleDeviceStrategy as FabricSingleDevice
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.strategies import SingleDeviceStrategy
from typing_extensions import override

from lightning_anyaccel._lightning.stubs import SingleDeviceHooks
from lightning_anyaccel.accelerator import process_devices
from lightning_anyaccel.cluster import watchdog
from lightning_anyaccel.cluster.environments import external_process_count, process_count_error
from lightning_anyaccel.device.devices import device_of
from lightning_anyaccel.front_ends import FabricSide
from lightning_anyaccel.strategies.base import AnyStrategyMixin, FabricProgressMixin, Registered, fabric_class
from lightning_anyaccel.strategies.parameter_moves import FabricParameterMovesMixin, TrainerParameterMovesMixin
from lightning_anyaccel.strategies.steps import (
    Setup,
    align_precision,
    before_launch,
    check_accelerator,
    check_device_precision,
    in_worker,
    lightning_setup,
    watch_stalls_alone,
)

if TYPE_CHECKING:
    _Base = SingleDeviceHooks
else:
    _Base = object

#: The names the family registers with each front end.
NAMES: dict[str, Registered] = {"any_single": Registered("One device of the accelerator's type", {}, ("single_device",))}

#: What a single-device strategy does at setup, in order (launching process: the ``before_launch`` steps).
SETUP: Setup = (
    before_launch(check_accelerator),
    before_launch(align_precision),
    in_worker(lightning_setup),
    in_worker(check_device_precision),
    in_worker(watch_stalls_alone),
)


class LazyDeviceMixin(AnyStrategyMixin, _Base):
    """One process, one device, taken from the accelerator unless given.

    Lightning's connectors (Trainer and Fabric) hand the selected device over through
    ``parallel_devices``; ``devices=[1]`` with an XPU accelerator gives ``xpu:1``. Mixed in before
    Lightning's ``SingleDeviceStrategy`` (either front end).

    Args:
        device: a device such as ``"xpu:1"`` (``"xpu"`` is ``"xpu:0"``); ``None`` (default) takes the
            device selected by the ``accelerator`` and ``devices`` arguments.
        stall_timeout: seconds without a batch, a backward or an optimizer step before the stall watchdog
            prints the process's stack and ends it (``0``: off; ``None``:
            :func:`~lightning_anyaccel.cluster.watchdog.stall_timeout`, 30 min or ``$LIGHTNING_ANYACCEL_STALL_TIMEOUT``).
        **kwargs: the Lightning ``SingleDeviceStrategy`` arguments (accelerator, checkpoint_io, precision).
    """

    #: The device given or selected by the connector; ``None`` until then (Lightning's ``_root_device``,
    #: never read, keeps the ``"cpu"`` passed to its ``__init__``).
    _selected_device: torch.device | None
    strategy_name: ClassVar[str] = "any_single"
    setup_steps: ClassVar[Setup] = SETUP

    def __init__(self, device: str | torch.device | None = None, stall_timeout: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(device="cpu", **kwargs)
        #: The stall watchdog's bound given to the strategy (``None``: the environment's or the default).
        self.stall_timeout = stall_timeout
        # an unnumbered device ("hpu", as lightning-habana's SingleHPUStrategy takes it) is the process's device 0
        self._selected_device = process_devices([torch.device(device)])[0] if device is not None else None

    @property
    @override
    def root_device(self) -> torch.device:  # type: ignore[override]
        """The device given, else device 0 of the accelerator's type."""
        if self._selected_device is None:
            device_type = getattr(self.accelerator, "device_type", None)
            if device_type is None:
                raise MisconfigurationException(
                    f"{type(self).__name__}() has no device yet: pass it with an accelerator,"
                    f" or give one, e.g. {type(self).__name__}('xpu:0')."
                )
            return device_of(device_type)
        return self._selected_device

    @property
    def parallel_devices(self) -> list[torch.device]:
        """The one device, as a list: lets Lightning's connector hand over the selected device."""
        return [self._selected_device] if self._selected_device is not None else []

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        if len(devices) != 1:
            raise MisconfigurationException(
                f"strategy='{self.strategy_name}' trains on one device, but devices= selected {len(devices)}:"
                f" {devices}. Use devices=1, or strategy='any_ddp' for several devices."
            )
        self._selected_device = devices[0]

    @override
    def _configure_launcher(self) -> None:
        """Refuse a process of a multi-process launch (each would train alone), then the launch checks of :data:`SETUP`."""
        launched = external_process_count()
        if launched is not None and launched[1] != 1:
            raise process_count_error(launched[0], launched[1], devices=1, num_nodes=1,
                                      front_end=self.side.name.capitalize(), strategy="any_ddp")
        super()._configure_launcher()
        self._validate_device_setup()

    @override
    def teardown(self) -> None:
        """Lightning's teardown; the stall watchdog stops watching until the next setup (the process may idle now)."""
        watchdog.disarm()
        super().teardown()


class AnySingleDeviceStrategy(TrainerParameterMovesMixin, LazyDeviceMixin, SingleDeviceStrategy):
    """One process, one device; the device comes from the accelerator unless given (Trainer).

    Args:
        device: a device such as ``"xpu:1"``; ``None`` (default) takes the device selected by
            the Trainer's ``accelerator`` and ``devices``.
        accelerator, checkpoint_io, precision_plugin: as for Lightning's ``SingleDeviceStrategy``.
    """


@fabric_class("AnySingleDeviceStrategy")
class FabricSingleDeviceStrategy(FabricProgressMixin, FabricParameterMovesMixin, LazyDeviceMixin, FabricSingleDevice):
    """Fabric on one device of the accelerator's type (Fabric alone would pick ``"cpu"``).

    Published as ``lightning_anyaccel.fabric.AnySingleDeviceStrategy``.

    Example:
        >>> from lightning import Fabric
        >>> from lightning_anyaccel.fabric import AnyAccelerator, AnySingleDeviceStrategy
        >>> fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=AnySingleDeviceStrategy(), devices=1)
        >>> fabric.device
        device(type='cpu')
    """

    _side = FabricSide

    @override
    def setup_module(self, module: torch.nn.Module) -> Any:
        """Lightning's, after starting the stall watchdog: one device runs without ``fabric.launch()``, whose
        ``setup_environment`` would start it."""
        watch_stalls_alone(self)
        return super().setup_module(module)


__all__ = ["NAMES", "SETUP", "AnySingleDeviceStrategy", "FabricSingleDeviceStrategy", "LazyDeviceMixin"]
