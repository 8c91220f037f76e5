"""``AnyAccelerator``: one Lightning accelerator for every device type PyTorch knows.

Lightning's connector calls ``is_available``, ``parse_devices`` and ``get_parallel_devices`` on
the accelerator *class*, not the instance, so the device type has to live on the class.
``AnyAccelerator("xpu")`` therefore returns an instance of a small per-device subclass
(``AnyAccelerator[xpu]``) made once by :func:`accelerator_class`; all behaviour lives here,
in the base class, and reads the device table.

Example:
    >>> acc = AnyAccelerator("cpu")
    >>> acc
    AnyAccelerator('cpu')
    >>> type(acc).parse_devices(2), type(acc).get_parallel_devices(2)
    (2, [device(type='cpu'), device(type='cpu')])
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_anyaccel import runtime
from lightning_anyaccel.devices import DEVICE_TABLE, PRECISION_DTYPES, get_spec
from lightning_anyaccel.precision import align_precision_plugin, check_device_supports

_DEVICES_INPUT = int | str | list[int] | tuple[int, ...] | None
_CLASSES: dict[str, type[AnyAccelerator]] = {}


class DeviceCountError(MisconfigurationException):
    """``devices=`` asks for devices that are not there."""


class AnyAccelerator(Accelerator):
    """Accelerator for any ``torch.device`` type in :data:`~lightning_anyaccel.devices.DEVICE_TABLE`.

    Args:
        device_type: ``"xpu"``, ``"hpu"``, ``"npu"``, ``"cuda"``, ... or ``None`` for the accelerator
            ``torch.accelerator`` reports (``"cpu"`` when there is none).

    Raises:
        ValueError: for a device type the table does not know.
        DeviceNotAvailableError: when PyTorch sees no device of that type, with the install hint.
    """

    #: The device type of this class; ``None`` only on the base class.
    device_type: ClassVar[str | None] = None

    def __new__(cls, device_type: str | None = None) -> AnyAccelerator:
        if cls is AnyAccelerator:
            cls = accelerator_class(device_type or runtime.detect_device_type())
        elif device_type is not None and device_type != cls.device_type:
            raise ValueError(f"{cls.__qualname__} is for {cls.device_type!r}, not {device_type!r}.")
        return super().__new__(cls)

    def __init__(self, device_type: str | None = None) -> None:
        super().__init__()
        assert self.device_type is not None
        if not runtime.is_available(self.device_type):
            spec = get_spec(self.device_type)
            raise runtime.DeviceNotAvailableError(
                f"AnyAccelerator({self.device_type!r}): PyTorch sees no {spec.name} device here."
                f" Install {spec.install}"
                + (f" and `import {spec.vendor_module}`" if spec.vendor_module else "")
                + ", or use AnyAccelerator() to take whatever device is present (CPU otherwise)."
            )

    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        # per-device classes are made at runtime; rebuild through the factory in spawned children
        return (AnyAccelerator, (self.device_type,))

    def __repr__(self) -> str:
        return f"AnyAccelerator({self.device_type!r})"

    @classmethod
    def _type(cls) -> str:
        return cls.device_type or runtime.detect_device_type()

    # ----- what the connector asks the class -------------------------------------------------

    @classmethod
    @override
    def name(cls) -> str:  # type: ignore[override]
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
        return runtime.device_count(cls._type())

    @classmethod
    @override
    def parse_devices(cls, devices: _DEVICES_INPUT) -> int | list[int]:
        """Turn ``devices=`` into a process count (CPU) or a list of device indices.

        Accepts what Lightning users write: ``2``, ``-1`` (all), ``"auto"``, ``"0,1"``, ``"2"``,
        ``[0, 1]``. Indices are checked against the devices that exist.

        Raises:
            DeviceCountError: zero, negative or too many devices, or an index that does not exist.
        """
        device_type = cls._type()
        if device_type == "cpu":
            from lightning.fabric.accelerators.cpu import _parse_cpu_cores

            return _parse_cpu_cores(devices)
        available = runtime.device_count(device_type)
        name = get_spec(device_type).name
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
                " with num_nodes."
                if available
                else f"devices={devices!r} asks for {name} devices, but none are visible to PyTorch."
            )
        return indices

    @classmethod
    @override
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        """One ``torch.device`` per process: ``[xpu:0, xpu:1]`` for ``[0, 1]``; ``[cpu] * n`` for CPU."""
        device_type = cls._type()
        if device_type == "cpu":
            return [torch.device("cpu")] * int(devices)
        return [torch.device(device_type, index) for index in devices]

    # ----- per-process hooks --------------------------------------------------------------------

    @override
    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process and seed its RNG.

        Under Fabric, also refuse a Lightning strategy that would train elsewhere or run CUDA-only
        code (Fabric, unlike the Trainer, has no later hook where the accelerator could repair it).

        Raises:
            MisconfigurationException: when a strategy hands over a device of another type.
        """
        assert self.device_type is not None
        fabric_strategy = _fabric_strategy_of_caller(self)
        if fabric_strategy is not None:
            _check_fabric_strategy(fabric_strategy, self.device_type)
        if device.type != self.device_type:
            if device.type == "cpu":
                # Trainer: Lightning's connector picks SingleDeviceStrategy("cpu") for any accelerator that
                # is not CUDA/MPS; `setup(trainer)` moves the strategy to our device before the model moves.
                # (Fabric has no such hook: `_check_fabric_strategy` refused that case above.)
                return
            raise MisconfigurationException(
                f"{self!r} was given the device {device}. Use a strategy on {self.device_type!r}"
                " devices, e.g. strategy='any_single' or 'any_ddp'."
            )
        runtime.set_device_index(device)
        seed = runtime.global_seed()
        if seed is not None:
            runtime.seed(self.device_type, seed)

    def setup(self, trainer: Any) -> None:
        """Make the Trainer's strategy and precision use this device type before the model moves.

        Repairs the two ways Lightning routes a third-party accelerator wrongly (audit rows 4
        and 8): a ``SingleDeviceStrategy("cpu")`` picked for one device, and a mixed-precision
        plugin built for ``"cuda"``. Refuses Lightning strategies that run CUDA-only code paths
        on other devices, with the strategy to use instead.
        """
        assert self.device_type is not None
        requested = getattr(trainer._accelerator_connector, "_parallel_devices", None) or [None]
        _align_strategy(trainer.strategy, self.device_type, requested[0])
        precision = trainer.strategy.precision_plugin
        check_device_supports(getattr(precision, "precision", ""), trainer.strategy.root_device)

    @override
    def teardown(self) -> None:
        """Give cached device memory back so the next fit (or another process) can use it."""
        assert self.device_type is not None
        runtime.empty_cache(self.device_type)

    @override
    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory statistics for :class:`~lightning.pytorch.callbacks.DeviceStatsMonitor`."""
        return runtime.memory_stats(torch.device(device))

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        """Register ``"any"`` and every table device Lightning has no accelerator for."""
        accelerator_registry.register(
            "any", AnyAccelerator, description="The accelerator torch.accelerator reports, else CPU", override=True
        )
        for spec in DEVICE_TABLE.values():
            if spec.lightning_builtin is None:
                accelerator_registry.register(
                    spec.type, accelerator_class(spec.type), description=f"{spec.name} via lightning-anyaccel",
                    override=True,
                )


def accelerator_class(device_type: str) -> type[AnyAccelerator]:
    """The ``AnyAccelerator`` subclass bound to ``device_type`` (made once, then cached).

    >>> accelerator_class("xpu").__qualname__
    'AnyAccelerator[xpu]'
    """
    get_spec(device_type)  # unknown types fail here, with the list of known ones
    if device_type not in _CLASSES:

        def is_available() -> bool:
            return runtime.is_available(device_type)

        _CLASSES[device_type] = type(
            f"AnyAccelerator[{device_type}]",
            (AnyAccelerator,),
            {
                "device_type": device_type,
                "is_available": staticmethod(is_available),
                "__qualname__": f"AnyAccelerator[{device_type}]",
                "__module__": __name__,
                "__doc__": f"AnyAccelerator bound to {get_spec(device_type).name}.",
            },
        )
    return _CLASSES[device_type]


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


def _align_strategy(strategy: Any, device_type: str, requested: torch.device | None) -> None:
    """Point a Lightning strategy and its precision plugin at ``device_type`` (see ``AnyAccelerator.setup``).

    ``requested`` is the device the user's ``devices=`` selected (the connector's first parallel device).
    """
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from lightning_anyaccel.strategies.common import AnyStrategyMixin

    root = strategy.root_device
    if root.type != device_type:
        if type(strategy) is SingleDeviceStrategy and root.type == "cpu":
            device = requested if requested is not None and requested.type == device_type else None
            device = device or torch.device(device_type, 0)
            rank_zero_info(f"lightning-anyaccel: moving the single-device strategy from {root} to {device}.")
            strategy._root_device = device
            strategy.accelerator.setup_device(device)
        else:
            raise MisconfigurationException(
                f"{type(strategy).__name__} runs on {root}, but the accelerator is {device_type!r}."
                " Use strategy='any_single' (one device) or 'any_ddp' (several)."
            )
    if not isinstance(strategy, AnyStrategyMixin) and get_spec(device_type).lightning_builtin is None:
        if type(strategy) is not SingleDeviceStrategy:
            raise MisconfigurationException(_cuda_only_message(type(strategy).__name__, device_type))
    strategy.precision_plugin = align_precision_plugin(strategy.precision_plugin, device_type)
    module = strategy.lightning_module
    if device_type == "cpu" and module is not None and any(p.is_shared() for p in module.parameters()):
        # Lightning's own spawn launcher unshares weights only for its CPUAccelerator: without
        # this every rank would step the same shared-memory weights.
        _disable_module_memory_sharing(module)


def _cuda_only_message(strategy_name: str, device_type: str) -> str:
    return (
        f"Lightning's {strategy_name} runs CUDA-only code paths and can not train on {get_spec(device_type).name}."
        " Use strategy='any_ddp' (or 'any_ddp_spawn', 'any_ddp_notebook')."
    )


def _fabric_strategy_of_caller(accelerator: AnyAccelerator, max_depth: int = 4) -> Any | None:
    """The Fabric strategy on whose behalf Lightning calls ``setup_device``; ``None`` under the Trainer.

    Lightning calls ``accelerator.setup_device(device)`` from ``Strategy.setup_environment`` and from
    ``Fabric.to_device`` without passing the strategy; the calling frame's ``self`` is that strategy
    (or the ``Fabric``). Frames of the accelerator itself (a subclass calling ``super()``) are skipped.
    The tests pin this against Lightning's current call sites.
    """
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import Strategy as FabricStrategy

    frame = sys._getframe(2)
    for _ in range(max_depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not accelerator:
            if isinstance(owner, Fabric):
                return owner.strategy
            return owner if isinstance(owner, FabricStrategy) else None
        frame = frame.f_back
    return None


def _check_fabric_strategy(strategy: Any, device_type: str) -> None:
    """Refuse a Lightning Fabric strategy that would silently train elsewhere (audit rows 4, 8, 11).

    Fabric picks ``SingleDeviceStrategy("cpu")`` for one device of any accelerator but CUDA/MPS and
    ``MixedPrecision(device="cuda")`` for any accelerator flag but ``"cpu"``/``"mps"``, and caches the
    precision plugin in the ``Fabric`` object, so neither can be repaired here: this fails fast and
    names the strategy that works. The package's own strategies are always accepted.
    """
    from lightning.fabric.strategies import SingleDeviceStrategy

    from lightning_anyaccel.strategies.common import AnyStrategyMixin

    if isinstance(strategy, AnyStrategyMixin):
        return
    spec = get_spec(device_type)
    name = type(strategy).__name__
    root = strategy.root_device
    if root.type != device_type:
        raise MisconfigurationException(
            f"Fabric chose Lightning's {name} on {root} for AnyAccelerator({device_type!r}) (it does so for every"
            f" accelerator but CUDA and MPS): the model would train on {root.type}, not on {spec.name}."
            " Pass strategy='any_single' (one device) or strategy='any_ddp' (several) to Fabric."
        )
    if spec.lightning_builtin is None and type(strategy) is not SingleDeviceStrategy:
        raise MisconfigurationException(_cuda_only_message(name, device_type))
    plugin = strategy.precision
    flag = getattr(plugin, "precision", None)
    if flag in PRECISION_DTYPES and getattr(plugin, "device", device_type) != device_type:
        raise MisconfigurationException(
            f"Fabric built {type(plugin).__name__}(precision={flag!r}, device={plugin.device!r}) for"
            f" AnyAccelerator({device_type!r}): autocast would target {plugin.device!r}, switch itself off and"
            f" train in fp32. Pass strategy='any_single' or 'any_ddp' (they build it for {device_type!r}), or"
            f" plugins=MixedPrecision({flag!r}, device={device_type!r}) instead of precision=."
        )
