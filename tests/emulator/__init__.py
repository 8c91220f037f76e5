"""An emulated accelerator for tests: a real PrivateUse1, XPU or HPU device without hardware.

``emulator.load("npu")`` compiles (once, cached under ``tests/emulator/_build/``) and loads a C++
backend (``csrc/emulator.cpp``) as PrivateUse1, renames it to the given device type, registers a
device module as ``torch.<name>`` and a collective backend for that device type, the way
out-of-tree vendors (torch_npu, torch_mlu, torch_musa, torch_sdaa) do. ``emulator.load("xpu")`` and
``emulator.load("hpu")`` serve torch's built-in device types instead, on their own dispatch keys
(``XPU``/``HPU``): what torch's CPU build lacks for them is stood in for (``torch._C._xpu_*``
bindings under torch's own ``torch.xpu``; ``torch.hpu`` and ``habana_frameworks.torch``), see
docs/emulator.md. Afterwards tensors live
on ``<name>:0``/``<name>:1`` in device memory the host can not read except through copies, each
device has a capacity (``memory_bytes``) enforced by a caching allocator, compute runs CPU kernels
that refuse operands on another device, side streams are ordered only by waits, autocast
dispatches for the device type and collectives move device tensors between processes (staged
through gloo). ``torch.accelerator.current_accelerator()`` reports the device.

A process hosts one emulated device type, under one name: loading a second name fails.
Set ``LIGHTNING_ANYACCEL_EMULATE=<name>`` and put ``tests/emulator/autoload`` on ``PYTHONPATH``
to get the device in every Python process (children, notebook kernels) without code changes.

Options make it a *lesser* backend, as some out-of-tree vendors' are (``acme:2:noshallow,noautocast``,
see :data:`OPTIONS`), so the package's refusals and repairs for them run on a device, not in theory;
``memory=SIZE`` sets each device's capacity (``acme:2:memory=256MiB``).

Test support only: it is never installed with the package, and nothing it does proves vendor
kernels, vendor collectives or performance.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

__all__ = ["BACKEND", "BUILTIN_TYPES", "DEFAULT_MEMORY_BYTES", "ENV_VAR", "OPTIONS", "backend_name", "load",
           "loaded_name", "loaded_options", "parse_memory_bytes", "parse_options"]

#: The environment variable the autoload hook reads (``npu``, ``mlu``, ``emu:4`` for 4 devices,
#: ``acme:2:noshallow,noautocast`` for 2 devices of a lesser backend, ``acme:2:memory=256MiB`` for 2
#: devices of 256 MiB each).
ENV_VAR = "LIGHTNING_ANYACCEL_EMULATE"

#: What each emulated device holds unless ``memory_bytes``/``memory=SIZE`` says otherwise: past it,
#: allocation raises ``torch.OutOfMemoryError``. Address space only: host memory is used as tensors use it.
DEFAULT_MEMORY_BYTES = 16 << 30

#: The collective backend registered for the emulated device type. Vendors register theirs
#: (hccl, cncl, ...) the same way; a name of its own keeps records from claiming a vendor library ran.
BACKEND = "emuccl"

#: ``NAME:COUNT:OPTION,OPTION`` options: what the backend lacks, as some vendors' backends do.
OPTIONS: dict[str, str] = {
    "noshallow": "tensors can not be shallow-copied into CPU tensors (`aten::_has_compatible_shallow_copy_type` is"
                 " False): `module.to(device)` replaces parameters instead of moving them in place",
    "noautocast": "the device module has no `get_amp_supported_dtype`/`is_bf16_supported`: `torch.autocast` fails",
    "nocollectives": "no collective backend is registered for the device type",
    "noavg": "the collective backend refuses `ReduceOp.AVG` when it is called, as some vendors' libraries do (a"
             " mean is a sum divided by the group's size there)",
}

#: Device types torch builds in that the emulator serves on their own dispatch keys (no rename).
BUILTIN_TYPES = ("xpu", "hpu")

#: The vendors' collective backends of the built-in types, which the emulator provides under
#: their names: ``hccl`` registered as Habana's bridge registers it, ``xccl`` through a stand-in of
#: torch's own ``ProcessGroupXCCL`` binding (see ``_stand_in_process_group_xccl``).
VENDOR_BACKENDS = {"hpu": "hccl", "xpu": "xccl"}

_lock = threading.Lock()
_loaded: str | None = None
_options: frozenset[str] = frozenset()
#: The Python kernels an option registers; kept alive for the life of the process.
_libraries: list[torch.library.Library] = []


def backend_name(device_type: str) -> str:
    """The collective backend name registered for the emulated ``device_type``."""
    return VENDOR_BACKENDS.get(device_type, BACKEND)


def loaded_name() -> str | None:
    """The device type the emulator was loaded as in this process, or ``None``."""
    return _loaded


def parse_spec(spec: str) -> tuple[str, int]:
    """``"npu"`` -> ``("npu", 2)``, ``"emu:4"`` -> ``("emu", 4)`` (options, a third field, are :func:`parse_options`'s)."""
    name, _, rest = spec.partition(":")
    count = rest.partition(":")[0]
    return name.strip(), int(count) if count else 2


def parse_options(spec: str) -> frozenset[str]:
    """``"acme:2:noshallow,noautocast"`` -> ``{"noshallow", "noautocast"}``; unknown options raise, listing :data:`OPTIONS`.

    ``memory=SIZE`` is not a flag: :func:`parse_memory_bytes` reads it.
    """
    fields = spec.split(":")
    options = frozenset(o.strip() for o in (fields[2] if len(fields) > 2 else "").split(",")
                        if o.strip() and not o.strip().startswith(_MEMORY_OPTION))
    unknown = sorted(options - set(OPTIONS))
    if unknown:
        raise ValueError(f"Unknown emulator option(s) {unknown} in {spec!r}; known: {', '.join(OPTIONS)}.")
    return options


_MEMORY_OPTION = "memory="
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_memory_bytes(spec: str) -> int | None:
    """``"acme:2:memory=256MiB"`` -> ``268435456`` (the capacity of each device); ``None`` where the spec sets none.

    Sizes are bytes or a number with a unit: ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of 1024) or ``KB``,
    ``MB``, ``GB``, ``TB`` (powers of 1000).
    """
    import re

    fields = spec.split(":")
    sizes = [o.strip()[len(_MEMORY_OPTION):] for o in (fields[2] if len(fields) > 2 else "").split(",")
             if o.strip().startswith(_MEMORY_OPTION)]
    if not sizes:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", sizes[-1])
    if match is None:
        raise ValueError(f"Unknown memory size {sizes[-1]!r} in {spec!r}; write e.g. memory=256MiB, memory=2GiB or"
                         f" memory=1000000 (bytes).")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def loaded_options() -> frozenset[str]:
    """The options the emulator was loaded with in this process."""
    return _options


def load(name: str, devices: int = 2, options: frozenset[str] = frozenset(),
         memory_bytes: int | None = None) -> ModuleType:
    """Make ``devices`` emulated devices of type ``name`` exist in this process; return ``torch.<name>``.

    ``options`` (see :data:`OPTIONS`) take away what some vendors' backends lack. ``memory_bytes``
    is each device's capacity (:data:`DEFAULT_MEMORY_BYTES` if ``None``): an allocation past it
    raises ``torch.OutOfMemoryError``. Idempotent for the same name. Raises ``RuntimeError`` for a
    different name (a process hosts one emulated device type). ``xpu`` and ``hpu`` are served on
    their own dispatch keys; any other name is PrivateUse1 renamed.
    """
    global _loaded, _options
    with _lock:
        if _loaded is not None:
            if _loaded != name:
                raise RuntimeError(
                    f"The emulated device is already loaded as {_loaded!r} in this process; a process"
                    f" can host one PrivateUse1 backend, so it can not also be {name!r}."
                )
            return getattr(torch, name)
        if name in BUILTIN_TYPES:
            module = _load_builtin(name, devices, memory_bytes)
            _loaded = name
            return module
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise RuntimeError(f"PrivateUse1 is already registered as {current!r} in this process.")
        from emulator._build_ext import import_extension

        ext = import_extension()
        _activate(ext, "privateuseone", devices, memory_bytes)
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
        module = _device_module(name, ext)
        if "noautocast" in options:
            del module.get_amp_supported_dtype, module.is_bf16_supported
        torch._register_device_module(name, module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True
        )
        if "noshallow" in options:
            _refuse_shallow_copies()
        _attention_on_the_math_backend(name)
        if "nocollectives" not in options:
            _register_collectives(name, avg="noavg" not in options)
        _loaded, _options = name, frozenset(options)
        return module


def _activate(ext: Any, device_type: str, devices: int, memory_bytes: int | None) -> None:
    """The C++ backend serves ``device_type`` with ``devices`` devices of ``memory_bytes`` each, checking
    devices as torch's own kernels do (:func:`_unchecked_operators`)."""
    ext.activate(device_type)
    ext.set_device_count(devices)
    ext.set_memory_bytes(DEFAULT_MEMORY_BYTES if memory_bytes is None else memory_bytes)
    unchecked = _unchecked_operators()
    if unchecked is not None:
        ext.set_unchecked_operators(unchecked)


def _unchecked_operators() -> list[str] | None:
    """The operators marked ``device_check: NoCheck`` in the ``native_functions.yaml`` torch ships (in
    ``torchgen``): their kernels check devices themselves (CPU scalars pass), every other kernel refuses
    arguments on two devices. ``None`` where torch ships no such file (every operator is then checked as
    TensorIterator checks)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torchgen")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(p) / "packaged" / "ATen" / "native" / "native_functions.yaml" for p in locations]
    path = next((f for f in files if f.is_file()), None)
    if path is None:
        return None
    names, current = [], ""
    for line in path.read_text().splitlines():  # a line scan: parsing the YAML takes a second per process
        if line.startswith("- func:"):
            current = line[len("- func:"):].strip().split("(", 1)[0]
        elif current and line.strip().startswith("device_check:") and "NoCheck" in line:
            names.append(current)
    return names


def _refuse_shallow_copies() -> None:
    """``noshallow``: the kernel out-of-tree backends without shallow-copy support answer with."""
    import warnings

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        library.impl("_has_compatible_shallow_copy_type", lambda self, src: False, "PrivateUse1")
    _libraries.append(library)


def _attention_on_the_math_backend(name: str) -> None:
    """``scaled_dot_product_attention`` on its math backend (matmul, softmax: the device's CPU kernels).

    torch's attention asks the backend which kernel to use. For ``hpu`` (and PrivateUse1 names) it
    asks the operator ``aten::_fused_sdp_choice``, which the CPU fallback would answer by running
    the CPU choice on CPU views of the tensors; under ``torch.compile`` the tensors are fake, have
    no memory to view, and tracing failed ("Cannot access data pointer of Tensor"). Real backends
    answer from the tensors' metadata; the emulator answers "math" without reading them. For ``xpu``
    torch asks a dispatch stub directly, whose XPU slot a CPU build of torch lacks ("An unexpected
    device type was provided xpu"): there the operator itself gets an ``AutogradXPU`` kernel, the
    composite math implementation (differentiable through its parts), as torch runs it for the
    other names. See docs/emulator.md.
    """
    import warnings

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torch with a PrivateUse1 answer of its own: the emulator's replaces it
        library.impl("_fused_sdp_choice", _math_choice, {"xpu": "XPU", "hpu": "HPU"}.get(name, "PrivateUse1"))
    if name == "xpu":
        library.impl("scaled_dot_product_attention", _attention_math, "AutogradXPU")
    _libraries.append(library)


def _math_choice(*args: Any, **kwargs: Any) -> int:
    from torch.nn.attention import SDPBackend

    return int(SDPBackend.MATH.value)


def _attention_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False) -> torch.Tensor:
    """What torch's ``scaled_dot_product_attention`` runs for the math backend: a boolean mask made additive."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


# ------------------------------------------------------------------------------ device module


def _device_module(name: str, ext: Any) -> ModuleType:
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
    module.default_generators = tuple(ext.default_generator(i) for i in range(ext.device_count()))
    return module


# ------------------------------------------------------------------------------ built-in types: xpu, hpu


def _load_builtin(name: str, devices: int, memory_bytes: int | None) -> ModuleType:
    """Serve torch's built-in ``xpu`` or ``hpu`` type: C++ on their dispatch keys, Python stand-ins."""
    from emulator._build_ext import import_extension

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
        self.platform_name = self.vendor = "lightning-anyaccel tests/emulator"
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

    ``core.mark_step()`` ends a lazy-mode graph on Gaudi; the emulator runs every op eagerly, so it
    has nothing to do. ``distributed.hccl`` is the module whose import registers ``hccl``; the
    emulator registered it already (``_register_collectives``).
    """
    names = ["habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core",
             "habana_frameworks.torch.hpu", "habana_frameworks.torch.hpu.random", "habana_frameworks.torch.utils",
             "habana_frameworks.torch.utils.experimental", "habana_frameworks.torch.distributed",
             "habana_frameworks.torch.distributed.hccl"]
    modules = {n: ModuleType(n, "Stand-in of the emulated hpu (lightning-anyaccel tests/emulator).") for n in names}
    modules["habana_frameworks.torch.hpu"] = hpu
    modules["habana_frameworks.torch.core"].mark_step = lambda *args, **kwargs: None
    modules["habana_frameworks.torch.core"].hpu = hpu  # DeepSpeed's HPU accelerator reads htcore.hpu.Event
    for attr in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "initial_seed",
                 "default_generators"):  # DeepSpeed's HPU accelerator seeds through hpu.random
        setattr(modules["habana_frameworks.torch.hpu.random"], attr, getattr(hpu, attr))
    modules["habana_frameworks.torch.utils.experimental"]._is_fp16_supported = lambda: True
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


# ------------------------------------------------------------------------------ collectives


def _register_collectives(name: str, avg: bool = True) -> None:
    """Register ``backend_name(name)`` for the device type, as vendors register hccl/cncl/...

    ``avg=False`` (option ``noavg``): its groups refuse ``ReduceOp.AVG``.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return
    from emulator.collectives import make_creator

    backend = backend_name(name)
    if backend == "xccl":
        _stand_in_process_group_xccl()
    elif backend.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(backend, make_creator(name, backend, avg=avg), devices=[name])


def _stand_in_process_group_xccl() -> None:
    """``xccl`` is built into torch: ``init_process_group`` creates it itself, from the binding
    ``torch._C._distributed_c10d.ProcessGroupXCCL``, before it looks at registered backends, so
    ``Backend.register_backend("xccl", ...)`` can never be reached. A CPU build lacks that binding
    (``torch.distributed.distributed_c10d`` then sets ``_XCCL_AVAILABLE = False`` at import, which
    happens inside ``import torch``, before any emulator code can run). The stand-in is the binding:
    a ``ProcessGroupXCCL`` with ``Options`` that creates the emulator's process group, set where
    torch's import would have put it, with ``_XCCL_AVAILABLE``."""
    from torch.distributed import distributed_c10d as c10d

    from emulator.collectives import make_creator

    create = make_creator("xpu", "xccl")

    class ProcessGroupXCCL:
        """Stand-in of torch's XCCL binding on the emulated xpu (collectives staged through gloo)."""

        class Options:
            def __init__(self) -> None:
                self.global_ranks_in_group: list[int] = []
                self.group_name = ""
                self._timeout: Any = None

        def __new__(cls, store: Any, rank: int, size: int, options: Any) -> Any:
            return create(store, rank, size, options._timeout)

    c10d.ProcessGroupXCCL = ProcessGroupXCCL
    c10d._XCCL_AVAILABLE = True


def autoload_from_env() -> None:
    """Load the emulator when ``LIGHTNING_ANYACCEL_EMULATE`` names a device type (the autoload hook)."""
    spec = os.environ.get(ENV_VAR, "").strip()
    if not spec:
        return
    name, count = parse_spec(spec)
    try:
        load(name, devices=count, options=parse_options(spec), memory_bytes=parse_memory_bytes(spec))
    except Exception as err:  # a broken emulator must say so, not silently give a CPU run
        print(f"emulator: could not load {spec!r} from ${ENV_VAR}: {err}", file=sys.stderr)
        raise
