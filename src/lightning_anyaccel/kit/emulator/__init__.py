"""The emulated accelerator: a real PrivateUse1, XPU or HPU device without hardware.

``emulator.load("npu")`` compiles (once per torch version, cached per user: ``emulator/build.py``) and loads a C++
backend (``csrc/emulator.cpp``) as PrivateUse1, renames it to the given device type, registers a
device module as ``torch.<name>`` and a collective backend for that device type, the way
out-of-tree vendors (torch_npu, torch_mlu, torch_musa, torch_sdaa) do: under the vendor's name
(``hccl``, ``cncl``, ``mccl``, ``tccl``) for a type the device table knows, ``emuccl`` otherwise, with
a stand-in of the vendor's package (``stand_ins.py``) that DeepSpeed's accelerator imports. ``emulator.load("xpu")`` and
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

from lightning_anyaccel.kit.emulator.names import (
    BACKEND,
    BUILTIN_TYPES,
    DEFAULT_MEMORY_BYTES,
    ENV_VAR,
    MIN_MEMORY_BYTES,
    OPTIONS,
    VENDOR_BACKENDS,
    backend_name,
    check_spec,
    parse_memory_bytes,
    parse_options,
    parse_spec,
)

__all__ = ["AUTOLOAD", "BACKEND", "BUILTIN_TYPES", "DEFAULT_MEMORY_BYTES", "ENV_VAR", "MIN_MEMORY_BYTES", "OPTIONS",
           "backend_name", "check_spec", "emulate", "load", "loaded_name", "loaded_options", "parse_memory_bytes",
           "parse_options", "parse_spec", "VENDOR_BACKENDS"]

#: The folder to put on ``PYTHONPATH``: its ``sitecustomize`` loads the device when ``ENV_VAR`` is set.
AUTOLOAD = Path(__file__).resolve().parent / "autoload"

_lock = threading.Lock()
_loaded: str | None = None
_options: frozenset[str] = frozenset()


def loaded_name() -> str | None:
    """The device type the emulator was loaded as in this process, or ``None``."""
    return _loaded


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
        from lightning_anyaccel.kit.emulator.backend import (
            _activate,
            _attention_on_the_math_backend,
            _refuse_shallow_copies,
            _register_collectives,
        )
        from lightning_anyaccel.kit.emulator.build import import_extension
        from lightning_anyaccel.kit.emulator.device_module import device_module

        if name in BUILTIN_TYPES:
            from lightning_anyaccel.kit.emulator.builtin import load_builtin

            module = load_builtin(name, devices, memory_bytes)
            _loaded = name
            return module
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise RuntimeError(f"PrivateUse1 is already registered as {current!r} in this process.")
        ext = import_extension()
        _activate(ext, "privateuseone", devices, memory_bytes)
        if "noprofiler" not in options:
            ext.register_profiler()  # torch.profiler records the device's own activity (csrc/profiler.cpp)
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
        module = device_module(name, ext)
        if "noautocast" in options:
            del module.get_amp_supported_dtype, module.is_bf16_supported
        torch._register_device_module(name, module)
        from lightning_anyaccel.kit.emulator.stand_ins import stand_in_vendor_module

        stand_in_vendor_module(name, module)  # torch_npu, torch_sdaa, ...: what DeepSpeed and users import
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


def emulate(name: str = "npu", devices: int = 2, memory: str | int | None = None,
            options: frozenset[str] = frozenset()) -> torch.device:
    """Load the emulated device in this process and in every Python process it starts; return ``torch.device(name)``.

    ``memory``: each device's capacity (``"4GiB"``, or bytes); ``options``: see :data:`OPTIONS`. A spec
    :func:`check_spec` refuses raises ``ValueError`` before anything loads; ``RuntimeError`` where torch in
    this process already answered which accelerator it has (``xpu``/``hpu`` after ``import lightning_anyaccel``). Sets ``LIGHTNING_ANYACCEL_EMULATE``
    and puts :data:`AUTOLOAD` on ``PYTHONPATH``, so DDP ranks and other children load it too.
    """
    fields = sorted(options) + ([f"memory={memory}"] if memory is not None else [])
    spec = f"{name}:{devices}" + (f":{','.join(fields)}" if fields else "")
    check_spec(spec)
    load(name, devices=devices, options=options, memory_bytes=parse_memory_bytes(spec))
    found = torch.accelerator.current_accelerator()
    if found is None or found.type != name:
        raise RuntimeError(
            f"torch in this process reports the accelerator {found}, not the emulated {name!r}: it had answered which"
            " accelerator the machine has before the device was loaded (importing lightning_anyaccel asks it), and"
            f" answers once per process. Load it at interpreter start: {ENV_VAR}={spec} with {AUTOLOAD} on"
            " PYTHONPATH, or run the program under `python -m lightning_anyaccel.emulate`.")
    os.environ[ENV_VAR] = spec
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(AUTOLOAD) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), *paths])
    return torch.device(name)


def problems_install() -> None:
    """Start recording the program's portability problems for ``python -m lightning_anyaccel.emulate``'s report."""
    from lightning_anyaccel.kit.emulator import problems

    problems.install()
