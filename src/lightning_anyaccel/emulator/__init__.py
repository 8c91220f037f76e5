"""The emulated accelerator: a real PrivateUse1, XPU or HPU device without hardware.

``emulator.load("npu")`` compiles (once per torch version, cached per user: ``emulator/build.py``) and loads a C++
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
Set ``LIGHTNING_ANYACCEL_EMULATE=<name>`` and put :data:`AUTOLOAD` on ``PYTHONPATH`` to get the
device in every Python process (children, notebook kernels) without code changes; that is what
``python -m lightning_anyaccel.emulate`` does. Importing ``lightning_anyaccel`` never imports this package.

Options make it a *lesser* backend, as some out-of-tree vendors' are (``acme:2:noshallow,noautocast``,
see :data:`OPTIONS`), so the package's refusals and repairs for them run on a device, not in theory;
``memory=SIZE`` sets each device's capacity (``acme:2:memory=256MiB``).

Nothing it does proves vendor kernels, vendor collectives or performance (docs/emulate.md).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["AUTOLOAD", "BACKEND", "BUILTIN_TYPES", "DEFAULT_MEMORY_BYTES", "ENV_VAR", "OPTIONS", "backend_name", "emulate",
           "load",
           "loaded_name", "loaded_options", "parse_memory_bytes", "parse_options"]

#: The folder to put on ``PYTHONPATH``: its ``sitecustomize`` loads the device when :data:`ENV_VAR` is set.
AUTOLOAD = Path(__file__).resolve().parent / "autoload"

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
        from lightning_anyaccel.emulator.backend import (_activate, _attention_on_the_math_backend,
                                                         _refuse_shallow_copies, _register_collectives)
        from lightning_anyaccel.emulator.build import import_extension
        from lightning_anyaccel.emulator.device_module import device_module

        if name in BUILTIN_TYPES:
            from lightning_anyaccel.emulator.builtin import load_builtin

            module = load_builtin(name, devices, memory_bytes)
            _loaded = name
            return module
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise RuntimeError(f"PrivateUse1 is already registered as {current!r} in this process.")
        ext = import_extension()
        _activate(ext, "privateuseone", devices, memory_bytes)
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
        module = device_module(name, ext)
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


def emulate(name: str = "npu", devices: int = 2, memory: str | int | None = None) -> torch.device:
    """Load the emulated device in this process and in every Python process it starts; return ``torch.device(name)``.

    ``memory``: each device's capacity (``"4GiB"``, or bytes). Sets ``LIGHTNING_ANYACCEL_EMULATE`` and
    puts :data:`AUTOLOAD` on ``PYTHONPATH``, so DDP ranks and other children load it too.
    """
    spec = f"{name}:{devices}" + (f":memory={memory}" if memory is not None else "")
    load(name, devices=devices, memory_bytes=parse_memory_bytes(spec))
    os.environ[ENV_VAR] = spec
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(AUTOLOAD) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), *paths])
    return torch.device(name)


def problems_install() -> None:
    """Start recording the program's portability problems for ``python -m lightning_anyaccel.emulate``'s report."""
    from lightning_anyaccel.emulator import problems

    problems.install()
