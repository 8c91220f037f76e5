"""``torch.<name>``: the device module of an emulated device type."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch


def device_module(name: str, ext: Any) -> ModuleType:
    """``torch.<name>``: what ``torch.get_device_module``, autocast and Lightning call on a device type."""
    module = ModuleType(f"torch.{name}", f"The emulated {name!r} device (test support).")

    def _index(device: Any = None) -> int:
        if device is None:
            return ext.current_device()
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type != name:
            raise ValueError(f"Expected a {name!r} device, got {device}")
        return ext.current_device() if device.index is None else device.index

    def memory_stats(device: Any = None) -> dict[str, Any]:
        return dict(ext.memory_stats(_index(device)))

    def _stat(key: str) -> Any:
        return lambda device=None: ext.memory_stats(_index(device))[key]

    def manual_seed(seed: int) -> None:
        ext.default_generator(ext.current_device()).manual_seed(int(seed))

    def manual_seed_all(seed: int) -> None:
        for i in range(ext.device_count()):
            ext.default_generator(i).manual_seed(int(seed))

    def seed() -> None:
        ext.default_generator(ext.current_device()).seed()

    def seed_all() -> None:
        for i in range(ext.device_count()):
            ext.default_generator(i).seed()

    def initial_seed() -> int:
        return ext.default_generator(ext.current_device()).initial_seed()

    def get_rng_state(device: Any = name) -> torch.Tensor:
        return ext.default_generator(_index(device)).get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = name) -> None:
        ext.default_generator(_index(device)).set_state(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        return [ext.default_generator(i).get_state() for i in range(ext.device_count())]

    def set_rng_state_all(states: list[torch.Tensor]) -> None:
        for i, state in enumerate(states):
            ext.default_generator(i).set_state(state)

    def synchronize(device: Any = None) -> None:
        ext.synchronize(_index(device))  # what side streams wrote lands

    class device:  # noqa: N801 (torch's device modules name it so)
        """Context manager that makes ``idx`` the current device."""

        def __init__(self, idx: Any) -> None:
            self.idx = _index(idx)
            self.prev = -1

        def __enter__(self) -> None:
            self.prev = ext.current_device()
            ext.set_device(self.idx)

        def __exit__(self, *exc: object) -> None:
            ext.set_device(self.prev)

    def current_stream(device: Any = None) -> torch.Stream:
        return torch.accelerator.current_stream(_index(device))

    def default_stream(device: Any = None) -> torch.Stream:
        return torch.Stream(device=torch.device(name, _index(device)), priority=0)

    @contextlib.contextmanager
    def stream(s: torch.Stream | None) -> Iterator[None]:
        if s is None:
            yield
            return
        prev = torch.accelerator.current_stream(s.device_index)
        torch.accelerator.set_stream(s)
        try:
            yield
        finally:
            torch.accelerator.set_stream(prev)

    def Stream(device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # noqa: N802
        return torch.Stream(device=torch.device(name, _index(device)), priority=priority)

    def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
        return torch.Event(device=name, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    def get_device_properties(device: Any = None) -> SimpleNamespace:
        index = _index(device)
        return SimpleNamespace(name=f"Emulated {name} device (host memory, CPU kernels)",
                               total_memory=ext.mem_get_info(index)[1], index=index)

    functions = {
        "get_device_properties": get_device_properties,
        "is_available": lambda: ext.device_count() > 0,
        "device_count": ext.device_count,
        "current_device": ext.current_device,
        "set_device": lambda device: ext.set_device(_index(device)),
        "is_initialized": ext.is_initialized,
        "_is_in_bad_fork": ext.is_in_bad_fork,
        "_lazy_init": ext.init,
        "init": ext.init,
        "synchronize": synchronize,
        "get_amp_supported_dtype": lambda: [torch.float16, torch.bfloat16],
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_device_name": lambda device=None: f"Emulated {name} device (host memory, CPU kernels)",
        "get_device_capability": lambda device=None: (0, 0),
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "seed": seed,
        "seed_all": seed_all,
        "initial_seed": initial_seed,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": get_rng_state_all,
        "set_rng_state_all": set_rng_state_all,
        "memory_stats": memory_stats,
        "memory_allocated": _stat("allocated_bytes.all.current"),
        "max_memory_allocated": _stat("allocated_bytes.all.peak"),
        "memory_reserved": _stat("reserved_bytes.all.current"),
        "max_memory_reserved": _stat("reserved_bytes.all.peak"),
        "reset_peak_memory_stats": lambda device=None: ext.reset_peak_memory_stats(_index(device)),
        "reset_accumulated_memory_stats": lambda device=None: ext.reset_accumulated_memory_stats(_index(device)),
        "mem_get_info": lambda device=None: tuple(ext.mem_get_info(_index(device))),
        "empty_cache": ext.empty_cache,
        "device": device,
        "current_stream": current_stream,
        "default_stream": default_stream,
        "stream": stream,
        "set_stream": torch.accelerator.set_stream,
        "Stream": Stream,
        "Event": Event,
        "_emulated": True,
    }
    for key, value in functions.items():
        setattr(module, key, value)
    setattr(module, "default_generators", tuple(ext.default_generator(i) for i in range(ext.device_count())))
    return module

