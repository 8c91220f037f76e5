"""``AnyAccelerator``: one Lightning accelerator for every device type PyTorch knows.

Lightning's connector calls ``is_available``, ``parse_devices`` and ``get_parallel_devices`` on
the accelerator *class*, not the instance, so the device type has to live on the class.
``AnyAccelerator("xpu")`` therefore returns an instance of a small per-device subclass
(``AnyAccelerator[xpu]``) made once by :meth:`AnyAccelerator.bound`; all behaviour lives here,
in the base class, and reads the device type's spec. The spec is resolved once where the device
enters: an instance resolves it when it is made (or takes the :class:`~lightning_anyaccel.device.spec.DeviceSpec`
it is given) and keeps it as :attr:`AnyAccelerator.spec`; each method Lightning calls on the class resolves
it once and passes it on. Which strategy trains with it is decided by
:mod:`lightning_anyaccel.wiring.policy`, for the Trainer and Fabric alike.

Example:
    >>> acc = AnyAccelerator("cpu")
    >>> acc
    AnyAccelerator('cpu')
    >>> type(acc).parse_devices(2), type(acc).get_parallel_devices(2)
    (2, [device(type='cpu'), device(type='cpu')])
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import DEVICE_TABLE, get_spec, known_device_types, present_device_types
from lightning_anyaccel.device.precision import check_device_supports
from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.troubleshooting import LinkedError

log = logging.getLogger(__name__)

_DEVICES_INPUT = int | str | list[int] | tuple[int, ...] | None
_CLASSES: dict[tuple[type, str], type] = {}


class DeviceCountError(LinkedError, MisconfigurationException):
    """``devices=`` asks for devices that are not there."""


class DeviceTypeError(LinkedError, MisconfigurationException, ValueError):
    """A device of another type than the accelerator's.

    Both Lightning's ``MisconfigurationException`` and the ``ValueError`` Lightning's own
    accelerators (``CUDAAccelerator.setup_device``) and vendor plugins raise, so either ``except`` catches it.
    """


class AnyAcceleratorMixin:
    """Marks the package's accelerator, whatever Lightning package it is built for (see :mod:`lightning_anyaccel.wiring.policy`)."""

    #: The device type of this class; ``None`` only on the unbound class.
    device_type: ClassVar[str | None] = None


class AnyAccelerator(AnyAcceleratorMixin, Accelerator):
    """Accelerator for any ``torch.device`` type PyTorch knows (see :func:`~lightning_anyaccel.device.devices.get_spec`).

    Args:
        device_type: ``"xpu"``, ``"hpu"``, ``"npu"``, ``"cuda"``, ... (or its
            :class:`~lightning_anyaccel.device.spec.DeviceSpec`), or ``None`` for the accelerator
            ``torch.accelerator`` reports (``"cpu"`` when there is none).

    Raises:
        ValueError: for a device type neither PyTorch nor the device table knows.
        DeviceNotAvailableError: when PyTorch sees no device of that type, with the install hint.
    """

    #: How many devices ``accelerator="auto"`` found when it chose this instance (:mod:`lightning_anyaccel.wiring.auto`);
    #: ``None`` for an accelerator the user named.
    found_by_auto: int | None = None
    #: The unbound class a per-device class was made from (what pickle rebuilds through).
    _unbound: ClassVar[type]
    #: The device type's spec, resolved once when this instance was made.
    spec: DeviceSpec

    def __new__(cls, device_type: str | DeviceSpec | None = None) -> AnyAccelerator:
        spec = device_type if isinstance(device_type, DeviceSpec) else get_spec(
            device_type or cls.device_type or runtime.detect_device_type())
        if cls.device_type is None:
            cls = cls.bound(spec)
        elif spec.type != cls.device_type:
            raise ValueError(f"{cls.__qualname__} is for {cls.device_type!r}, not {spec.type!r}.")
        instance = super().__new__(cls)
        instance.spec = spec
        return instance

    def __init__(self, device_type: str | DeviceSpec | None = None) -> None:
        super().__init__()
        spec = self.spec
        if not runtime.is_available(spec):
            raise runtime.DeviceNotAvailableError(
                f"AnyAccelerator({self.device_type!r}): PyTorch sees no {spec.name} device here."
                f" Install {spec.install}"
                + (f" and `import {spec.vendor_module}`" if spec.vendor_module else "")
                + ", or use AnyAccelerator() to take whatever device is present (CPU otherwise)."
            )

    @override
    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        # per-device classes are made at runtime; rebuild through the factory in spawned children
        return (self._unbound, (self.device_type,))

    @override
    def __repr__(self) -> str:
        return f"AnyAccelerator({self.device_type!r})"

    @classmethod
    def _spec(cls) -> DeviceSpec:
        """The spec of the class's device type (of the reported one on the unbound class), resolved for one call."""
        return get_spec(cls.device_type or runtime.detect_device_type())

    # ----- what the connector asks the class -------------------------------------------------

    @classmethod
    @override
    def name(cls) -> str:
        """The registry name: the device type, or ``"any"`` on the unbound base class."""
        return cls.device_type or "any"

    @staticmethod
    @override
    def is_available() -> bool:  # Lightning declares it static; the classes below bind the type
        return True

    @classmethod
    @override
    def auto_device_count(cls) -> int:
        """All visible devices of this type (1 on CPU: one process), counted without initialising them."""
        return runtime.device_count(cls._spec())

    @classmethod
    @override
    def parse_devices(cls, devices: _DEVICES_INPUT) -> int | list[int]:
        """Turn ``devices=`` into a process count (CPU) or a list of device indices.

        Accepts what Lightning users write: ``2``, ``-1`` (all), ``"auto"``, ``"0,1"``, ``"2"``,
        ``[0, 1]``. Indices are checked against the devices that exist.

        Raises:
            DeviceCountError: zero, negative or too many devices, or an index that does not exist.
        """
        spec = cls._spec()
        if spec.host:
            return _lightning.parse_cpu_cores(devices)
        available = runtime.device_count(spec)
        device_type, name = spec.type, spec.name
        indices = _device_indices(devices, available)
        if not indices:
            raise DeviceCountError(f"devices={devices!r} selects no {name} device. Pass a positive count or indices.")
        if len(set(indices)) != len(indices):
            raise DeviceCountError(f"devices={devices!r} lists a device twice. Each index may appear once.")
        missing = [i for i in indices if not 0 <= i < available]
        if missing:
            raise DeviceCountError(
                f"devices={devices!r} asks for {name} device(s) {missing}, but this machine has {available}"
                f" ({device_type}:0..{available - 1})."
                f" Use devices={available} or -1 for all of them, or fewer; for more processes per node, add nodes"
                " with num_nodes." + (f" {spec.count_hint}" if spec.count_hint else "")
                if available
                else f"devices={devices!r} asks for {name} devices, but none are visible to PyTorch."
            )
        return indices

    @classmethod
    @override
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        """One ``torch.device`` per process: ``[xpu:0, xpu:1]`` for ``[0, 1]`` or ``2``; ``[cpu] * n`` for CPU.

        ``devices`` is what :meth:`parse_devices` returns (indices), or a count as vendor plugins
        pass it (``get_parallel_devices(2)``: the first two devices). On a device type whose
        processes each see only their own card (``process_device_env`` in the device table,
        Gaudi), every process's device is ``<type>:0``.

        Raises:
            DeviceCountError: indices other than ``0..n-1`` on such a device type, naming the
                variable that selects the cards.
        """
        spec = cls._spec()
        if spec.host:
            return [spec.device()] * int(devices)
        indices = list(range(devices)) if isinstance(devices, int) else [int(index) for index in devices]
        return _process_devices(spec, [spec.device(index) for index in indices])

    # ----- per-process hooks --------------------------------------------------------------------

    @override
    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process and seed its RNG.

        Raises:
            DeviceTypeError: when a strategy hands over a device of another type (the policy in
                :mod:`lightning_anyaccel.wiring.policy` refuses such strategies before they start).
        """
        if device.type != self.spec.type:
            raise DeviceTypeError(
                f"{self!r} was given the device {device}. Use a strategy on {self.device_type!r}"
                " devices, e.g. strategy='any_single' or 'any_ddp', or no strategy."
            )
        runtime.set_device_index(self.spec, device.index)
        seed = runtime.global_seed()
        if seed is not None:
            runtime.seed(self.spec, seed)

    @override
    def setup(self, trainer: Any) -> None:
        """Trainer only: check the device can do the precision, and give each rank its own weights.

        Lightning's own spawn launcher unshares the model's weights only for its ``CPUAccelerator``;
        with a Lightning ``DDPStrategy(start_method="spawn")`` on ``AnyAccelerator("cpu")`` every rank
        would otherwise step the same shared-memory weights.
        """
        strategy = trainer.strategy
        check_device_supports(getattr(strategy.precision_plugin, "precision", ""), self.spec, strategy.root_device)
        module = strategy.lightning_module
        if self.spec.host and module is not None and any(p.is_shared() for p in module.parameters()):
            _lightning.disable_module_memory_sharing(module)

    @override
    def teardown(self) -> None:
        """Give cached device memory back so the next fit (or another process) can use it."""
        runtime.empty_cache(self.spec)

    @override
    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory statistics for :class:`~lightning.pytorch.callbacks.DeviceStatsMonitor`."""
        return runtime.memory_stats(self.spec, torch.device(device).index)

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register ``"any"`` and every device type Lightning has no accelerator for: the table's and those present."""
        accelerator_registry.register(
            "any", cls, description="The accelerator torch.accelerator reports, else CPU", override=True
        )
        for device_type in dict.fromkeys([*DEVICE_TABLE, *present_device_types()]):
            try:
                cls.register_device_type(accelerator_registry, get_spec(device_type))
            except Exception as err:  # noqa: BLE001 - a broken device must not break `import lightning_anyaccel`
                log.warning("lightning-anyaccel: accelerator=%r not registered: %s", device_type, err)

    @classmethod
    def register_device_type(cls, accelerator_registry: Any, spec: DeviceSpec) -> None:
        """Register ``accelerator="<type>"`` for ``spec``, unless Lightning has its own accelerator of that name."""
        if spec.lightning_builtin is None:
            accelerator_registry.register(
                spec.type, cls.bound(spec), description=f"{spec.name} via lightning-anyaccel", override=True
            )

    @classmethod
    def bound(cls, device: str | DeviceSpec) -> type[AnyAccelerator]:
        """The subclass of this (unbound) class for a device type (or its spec), made once, then cached.

        >>> AnyAccelerator.bound("xpu").__qualname__
        'AnyAccelerator[xpu]'
        """
        spec = device if isinstance(device, DeviceSpec) else get_spec(device)  # unknown types fail here, listing the known
        device_type = spec.type
        key = (cls, device_type)
        if key not in _CLASSES:

            def is_available() -> bool:  # asked by Lightning's connector: resolved at each ask
                return runtime.is_available(get_spec(device_type))

            metaclass: type[type] = type(cls)  # Lightning's Accelerator is an ABC: its metaclass
            _CLASSES[key] = metaclass(
                f"AnyAccelerator[{device_type}]",
                (cls,),
                {
                    "device_type": device_type,
                    "_unbound": cls,
                    "is_available": staticmethod(is_available),
                    "__qualname__": f"AnyAccelerator[{device_type}]",
                    "__module__": cls.__module__,
                    "__doc__": f"AnyAccelerator bound to {spec.name}.",
                },
            )
        return _CLASSES[key]


def accelerator_class(device_type: str, front_end: _lightning.Distribution = _lightning.LIGHTNING) -> type[AnyAccelerator]:
    """The ``AnyAccelerator`` class bound to ``device_type``, for ``front_end`` (default: ``lightning``).

    >>> accelerator_class("xpu").__qualname__
    'AnyAccelerator[xpu]'
    """
    return _lightning.port(AnyAccelerator, front_end).bound(device_type)


def process_devices(devices: list[torch.device]) -> list[torch.device]:
    """The device of each local rank, from a ``parallel_devices`` list (position *i* is local rank *i*).

    Unnumbered devices (``[torch.device("hpu")] * 8``, the form of lightning-habana's docs) are
    numbered by local rank. On a device type whose processes each see only their own card
    (``process_device_env`` in the device table, Gaudi), every rank's device is ``<type>:0``;
    its runtime gives local rank *i* its *i*-th card.

    >>> process_devices([torch.device("xpu")] * 2)
    [device(type='xpu', index=0), device(type='xpu', index=1)]
    >>> process_devices([torch.device("hpu")] * 2)
    [device(type='hpu', index=0), device(type='hpu', index=0)]

    Raises:
        DeviceCountError: a list that numbers some devices and not others, or (on a one-card-per-process
            device type) numbers them other than by local rank.
    """
    if not devices or devices[0].type not in known_device_types():
        return list(devices)
    return _process_devices(get_spec(devices[0].type), devices)


def _process_devices(spec: DeviceSpec, devices: list[torch.device]) -> list[torch.device]:
    """:func:`process_devices` of devices of ``spec``'s type."""
    if spec.host:
        return list(devices)
    device_type = spec.type
    indices = [device.index for device in devices]
    unnumbered = all(index is None for index in indices)
    if not unnumbered and None in indices:
        raise DeviceCountError(
            f"parallel_devices={[str(d) for d in devices]} numbers some devices and not others. Give every device"
            f" an index, or none: [torch.device({device_type!r})] * {len(devices)} numbers them by local rank."
        )
    env = spec.process_device_env
    if env is None:
        return [torch.device(device_type, i) for i in range(len(devices))] if unnumbered else list(devices)
    if not unnumbered and indices != list(range(len(devices))) and set(indices) != {0}:
        name = spec.name
        cards = ",".join(str(i) for i in indices)
        raise DeviceCountError(
            f"{name}: each process sees only its own card, as {device_type}:0, and local rank i gets the i-th card"
            f" of {env}. To train on cards {cards}, set {env}={cards} and pass devices={len(devices)}."
        )
    return [torch.device(device_type, 0)] * len(devices)


def _device_indices(devices: _DEVICES_INPUT, available: int) -> list[int]:
    """Indices selected by a Lightning ``devices=`` value, before checking they exist."""
    if devices is None or devices == "auto":
        return list(range(available))
    if isinstance(devices, str):
        text = devices.strip()
        if text == "-1":
            return list(range(available))
        if "," in text:
            return [int(part) for part in text.split(",") if part.strip()]
        devices = int(text)
    if isinstance(devices, bool):
        raise DeviceCountError(f"devices={devices!r} is not a device count. Pass an int, a list of indices or 'auto'.")
    if isinstance(devices, int):
        if devices == -1:
            return list(range(available))
        if devices < -1:
            raise DeviceCountError(f"devices={devices} is negative. Pass a positive count, -1 (all) or indices.")
        return list(range(devices))
    return [int(index) for index in devices]
