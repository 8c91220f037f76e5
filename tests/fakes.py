"""Simulated accelerators: monkeypatch torch's device APIs so a CPU build "sees" a device.

``install_fake_device(monkeypatch, "xpu", count=2)`` makes ``torch.get_device_module("xpu")``
return a :class:`FakeDeviceModule`, ``torch.accelerator`` report ``xpu`` and delegate to it, and
(optionally) ``torch.distributed.is_backend_available`` accept the device's backend. Every call
the package makes on the device is recorded in ``FakeDeviceModule.calls``.

PrivateUse1 devices (npu, sdaa, ...) also need ``torch.device("npu", 0)`` to parse, which only
``torch.utils.rename_privateuse1_backend`` gives — once per process. Tests for them run in a
subprocess (see ``test_simulated.py``).
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from lightning_anyaccel.device.devices import DEVICE_TABLE


class FakeDeviceModule:
    """Stands in for ``torch.xpu`` / ``torch.hpu`` / ``torch_npu``'s ``torch.npu`` ..."""

    def __init__(self, device_type: str, count: int, initialized: bool = False, bf16: bool = True) -> None:
        self.__name__ = f"torch.{device_type}"
        self.device_type = device_type
        self.count = count
        self.initialized = initialized
        self.bf16 = bf16
        self.calls: list[tuple[Any, ...]] = []

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def is_initialized(self) -> bool:
        return self.initialized

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", seed))

    def manual_seed(self, seed: int) -> None:
        self.calls.append(("manual_seed", seed))

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index))

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        self.calls.append(("memory_stats", str(device)))
        return {"allocated_bytes.all.current": 1024, "reserved_bytes.all.current": 2048}

    def current_allocated_memory(self) -> int:
        return 1024

    def driver_allocated_memory(self) -> int:
        return 4096

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache",))

    def is_bf16_supported(self) -> bool:
        return self.bf16

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        """What vendors' device modules answer ``torch.autocast`` (PrivateUse1 autocast needs it)."""
        return [torch.float16, torch.bfloat16]

    def get_device_name(self, index: int) -> str:
        return f"Fake {self.device_type.upper()} #{index}"


def install_fake_device(monkeypatch: Any, device_type: str, count: int = 2, *, initialized: bool = False,
                        bf16: bool = True, backend: str | None = None,
                        vendor_package: bool = True) -> FakeDeviceModule:
    """Make this process believe ``count`` devices of ``device_type`` exist (see module docstring).

    ``backend`` names a collective backend to report as registered (by default none is added,
    so the real registry of this CPU build answers). ``vendor_package``: the vendor's package that
    the device table names for the type (``habana_frameworks`` for ``hpu``) is found by
    ``importlib.util.find_spec`` and imported, as on the vendor's machines (empty modules: nothing
    imports from them), and DeepSpeed's probe for its accelerator of the type passes.
    """
    fake = FakeDeviceModule(device_type, count, initialized=initialized, bf16=bf16)
    real_get_device_module = torch.get_device_module
    real_autocast_available = torch.amp.is_autocast_available
    real_backend_available = torch.distributed.is_backend_available

    def get_device_module(device: Any = None) -> Any:
        name = device.type if isinstance(device, torch.device) else device
        return fake if name == device_type else real_get_device_module(device)

    current = SimpleNamespace(type=device_type)
    monkeypatch.setattr(torch, "get_device_module", get_device_module)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: current)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: fake.calls.append(("set_device_index", index)))
    # torch.accelerator.memory_stats/empty_cache are newer than the floor (2.8 lacks them): the fake
    # adds them where torch has none, and tests of the package's fallback remove them again.
    monkeypatch.setattr(torch.accelerator, "memory_stats", lambda index=None: fake.memory_stats(index), raising=False)
    monkeypatch.setattr(torch.accelerator, "empty_cache", fake.empty_cache, raising=False)
    monkeypatch.setattr(torch.amp, "is_autocast_available",
                        lambda name: True if name == device_type else real_autocast_available(name))
    if backend is not None:
        monkeypatch.setattr(torch.distributed, "is_backend_available",
                            lambda name: name == backend or real_backend_available(name))
    known = DEVICE_TABLE.get(device_type)
    if vendor_package:  # DeepSpeed's probe for its accelerator of the type passes, as on the vendor's machines
        from lightning_anyaccel.strategies import support

        real_probe = support._probe
        monkeypatch.setattr(support, "_probe", lambda name: None if name == device_type else real_probe(name))
    if vendor_package and known is not None and known.vendor_module is not None:
        parts = known.vendor_module.split(".")  # as after `import habana_frameworks.torch`: each level imported
        for name in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if name not in sys.modules:
                module = ModuleType(name)
                module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
                monkeypatch.setitem(sys.modules, name, module)
    return fake
