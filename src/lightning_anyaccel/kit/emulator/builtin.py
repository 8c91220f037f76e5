"""torch's built-in ``xpu`` and ``hpu`` served by the emulator on their own dispatch keys."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import torch

from lightning_anyaccel.kit.emulator.backend import _activate, _attention_on_the_math_backend, _register_collectives
from lightning_anyaccel.kit.emulator.device_module import device_module as _device_module


def load_builtin(name: str, devices: int, memory_bytes: int | None) -> ModuleType:
    """Serve torch's built-in ``xpu`` or ``hpu`` type: C++ on their dispatch keys, Python stand-ins."""
    from lightning_anyaccel.kit.emulator.build import import_extension

    ext = import_extension()
    _activate(ext, name, devices, memory_bytes)  # allocator, guard, hooks, kernels, fallback, autocast (C++)
    if name == "xpu":
        module = _stand_in_xpu_bindings(ext)
    else:
        module = _device_module(name, ext)
        generic_stats = module.memory_stats

        def memory_stats(device: Any = None) -> dict[str, Any]:
            """Also under the names Habana's ``torch.hpu.memory_stats()`` uses (DeepSpeed reads ``Limit``)."""
            stats = generic_stats(device)
            habana = {"Limit": module.mem_get_info(device)[1], "InUse": stats["allocated_bytes.all.current"],
                      "MaxInUse": stats["allocated_bytes.all.peak"], "NumAllocs": stats["num_device_alloc"],
                      "NumFrees": stats["num_device_free"]}
            return {**stats, **habana}

        module.memory_stats = memory_stats
        torch._register_device_module(name, module)
        _stand_in_habana_frameworks(module)
    _attention_on_the_math_backend(name)
    _register_collectives(name)
    return module


class _XpuDeviceProperties:
    """What ``torch.xpu.get_device_properties`` returns (a few of torch's fields, honest values)."""

    def __init__(self, index: int, total_memory: int) -> None:
        self.name = "Emulated xpu device (host memory, CPU kernels)"
        self.platform_name = self.vendor = "lightning-anyaccel emulator"
        self.driver_version = self.version = "emulated"
        self.type = "gpu"
        self.total_memory = total_memory
        self.has_fp16 = self.has_fp64 = self.has_bfloat16_conversions = True
        self.index = index

    def __repr__(self) -> str:
        return f"_XpuDeviceProperties(name={self.name!r}, total_memory={self.total_memory // 2**20}MB)"


def _stand_in_xpu_bindings(ext: Any) -> ModuleType:
    """The ``torch._C._xpu_*`` bindings a CPU build of torch lacks, so that torch's own ``torch.xpu``
    (reloaded once they exist) runs on the emulated device; returns ``torch.xpu``."""
    import importlib

    def memory_stats(device: int) -> dict[str, Any]:
        nested: dict[str, Any] = {}
        for key, value in ext.memory_stats(device).items():
            parts = key.split(".")
            node = nested
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return nested

    def init() -> None:
        ext.init()
        torch.xpu.default_generators = tuple(ext.default_generator(i) for i in range(ext.device_count()))
        torch.xpu._get_device_properties = lambda device=None: _XpuDeviceProperties(
            ext.current_device() if device is None or device < 0 else device, ext.mem_get_info(0)[1])

    def exchange(device: int) -> int:
        previous = ext.current_device()
        if device >= 0:
            ext.set_device(device)
        return previous

    def current_stream(device: int) -> tuple[int, int, int]:
        stream = torch.accelerator.current_stream(ext.current_device() if device is None or device < 0 else device)
        return stream.stream_id, stream.device_index, stream.device_type

    def set_stream(stream_id: int = 0, device_index: int = 0, device_type: int = 0) -> None:
        torch.accelerator.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                                  device_type=device_type))

    bindings = {
        "_has_xpu": True,
        "_XpuDeviceProperties": _XpuDeviceProperties,
        "_xpu_getDeviceCount": ext.device_count,
        "_xpu_init": init,
        "_xpu_isInBadFork": ext.is_in_bad_fork,
        "_xpu_getDevice": ext.current_device,
        "_xpu_setDevice": lambda device: ext.set_device(device) if device >= 0 else None,
        "_xpu_exchangeDevice": exchange,
        "_xpu_maybeExchangeDevice": exchange,
        "_xpu_synchronize": lambda device=None: ext.synchronize(-1 if device is None else device),
        "_xpu_getArchFlags": lambda: None,
        "_xpu_canDeviceAccessPeer": lambda device, peer: True,
        "_xpu_getCurrentStream": current_stream,
        "_xpu_getCurrentRawStream": lambda device=None: 0,  # no SYCL queue: kernels run on the host
        "_xpu_setStream": set_stream,
        "_xpu_memoryStats": memory_stats,
        "_xpu_resetPeakMemoryStats": ext.reset_peak_memory_stats,
        "_xpu_resetAccumulatedMemoryStats": ext.reset_accumulated_memory_stats,
        "_xpu_emptyCache": ext.empty_cache,
        "_xpu_getMemoryInfo": lambda device: tuple(ext.mem_get_info(device)),
    }
    # torch.xpu.Stream/Event derive from these: the generic torch.Stream/torch.Event of the device
    bindings["_XpuStreamBase"] = type("_XpuStreamBase", (torch.Stream,), {"sycl_queue": 0})
    bindings["_XpuEventBase"] = type("_XpuEventBase", (torch.Event,), {"sycl_event": 0})
    for key, value in bindings.items():
        setattr(torch._C, key, value)
    importlib.reload(torch.xpu.streams)
    module = importlib.reload(torch.xpu)  # re-reads torch._C._has_xpu and the bindings above
    module._emulated = True
    return module


def _stand_in_habana_frameworks(hpu: ModuleType) -> None:
    """The few ``habana_frameworks.torch`` modules Gaudi users import, over the emulated ``torch.hpu``.

    ``torch.hpu.is_autocast_hpu_enabled()`` is torch's ``is_autocast_enabled("hpu")``. ``core.mark_step()`` ends a
    lazy-mode graph on Gaudi; the emulator runs every op eagerly, so it
    has nothing to do. ``distributed.hccl`` is the module whose import registers ``hccl``; the
    emulator registered it already (``_register_collectives``).
    """
    names = ["habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core",
             "habana_frameworks.torch.hpu", "habana_frameworks.torch.hpu.random", "habana_frameworks.torch.utils",
             "habana_frameworks.torch.utils.experimental", "habana_frameworks.torch.distributed",
             "habana_frameworks.torch.distributed.hccl"]
    modules = {n: ModuleType(n, "Stand-in of the emulated hpu (lightning-anyaccel emulator).") for n in names}
    modules["habana_frameworks.torch.hpu"] = hpu
    modules["habana_frameworks.torch.core"].mark_step = lambda *args, **kwargs: None
    modules["habana_frameworks.torch.core"].hpu = hpu  # DeepSpeed's HPU accelerator reads htcore.hpu.Event
    for attr in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "initial_seed",
                 "default_generators"):  # DeepSpeed's HPU accelerator seeds through hpu.random
        setattr(modules["habana_frameworks.torch.hpu.random"], attr, getattr(hpu, attr))
    modules["habana_frameworks.torch.utils.experimental"]._is_fp16_supported = lambda: True
    # Habana's torch.hpu answers whether autocast is on (Gaudi code and lightning-habana's tests ask it)
    hpu.is_autocast_hpu_enabled = lambda: torch.is_autocast_enabled("hpu")
    for full, module in modules.items():
        if full == "habana_frameworks":
            continue
        parent, _, child = full.rpartition(".")
        setattr(modules[parent], child, module)
    for full, module in modules.items():
        if full != "habana_frameworks.torch.hpu":
            module.__path__ = []  # a package: its submodules import
            module._emulated = True
        sys.modules.setdefault(full, module)
    # Lightning-habana and the package find the module through its __spec__ / find_spec.
    import importlib.machinery

    for full, module in modules.items():
        if getattr(module, "__spec__", None) is None:
            module.__spec__ = importlib.machinery.ModuleSpec(full, None, is_package=True)

