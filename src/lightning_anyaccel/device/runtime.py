"""Small, device-generic wrappers around PyTorch's device APIs.

Each function takes the device type's :class:`~lightning_anyaccel.device.spec.DeviceSpec`, resolved
once by the caller (:func:`~lightning_anyaccel.device.devices.get_spec`), and answers through
``torch.accelerator`` / ``torch.get_device_module`` plus what the spec says; none resolves a device
type again. Nothing here branches on a device name, and nothing initialises a
device unless its docstring says so (counting devices must stay fork-safe). ``torch.accelerator``
APIs newer than the torch floor are feature-detected in :mod:`lightning_anyaccel._compat` and
preferred where present; the device module is the fallback.

Example:
    >>> from lightning_anyaccel.device.devices import get_spec, known_device_types
    >>> detect_device_type() in known_device_types()
    True
    >>> device_count(get_spec("cpu"))
    1
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

import torch

from lightning_anyaccel import _compat, _lightning
from lightning_anyaccel.device.devices import DEVICE_TABLE
from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.troubleshooting import LinkedError


class DeviceNotAvailableError(LinkedError, RuntimeError):
    """The requested device type is not usable in this process."""


def _vendor_installed(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.modules or importlib.util.find_spec(top) is not None


def import_vendor_module(spec: DeviceSpec) -> bool:
    """Import the vendor package that registers ``spec``'s device type with PyTorch, if it is installed.

    Returns ``True`` when the package was importable (or none is needed).

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> import_vendor_module(get_spec("cpu"))
    True
    """
    module = spec.vendor_module
    if module is None:
        return True
    if module in sys.modules:
        return True
    if not _vendor_installed(module):
        return False
    importlib.import_module(module)
    return True


def detect_device_type() -> str:
    """The device type PyTorch reports as its current, usable accelerator, else ``"cpu"``.

    Vendor packages named in the device table that are installed but not yet imported are
    imported first, so that e.g. Gaudi is found without ``import habana_frameworks.torch``.
    Does not initialise the device.

    >>> detect_device_type()  # on a machine without accelerators
    'cpu'
    """
    accelerator = _compat.current_accelerator()
    if accelerator is not None:
        return accelerator.type
    for spec in DEVICE_TABLE.values():
        if spec.vendor_module and spec.vendor_module not in sys.modules and _vendor_installed(spec.vendor_module):
            try:
                import_vendor_module(spec)
            except Exception:  # a broken vendor install must not break CPU users
                continue
            accelerator = _compat.current_accelerator()
            if accelerator is not None:
                return accelerator.type
    return "cpu"


def device_module(spec: DeviceSpec) -> ModuleType:
    """``torch.<type>`` (``torch.xpu``, ``torch.hpu``, ...) of ``spec``'s device type, importing the vendor package first.

    Raises:
        DeviceNotAvailableError: PyTorch has no module for this device type, with the install hint.

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> device_module(get_spec("cpu")).__name__
    'torch.cpu'
    """
    try:
        import_vendor_module(spec)
        return torch.get_device_module(spec.type)
    except (RuntimeError, ImportError, AttributeError) as err:
        vendor = f" and `import {spec.vendor_module}`" if spec.vendor_module else ""
        raise DeviceNotAvailableError(
            f"PyTorch in this environment does not know the device type {spec.type!r} ({spec.name})."
            f" Install {spec.install}{vendor}, or choose another device, e.g. `AnyAccelerator('cpu')`."
        ) from err


def is_available(spec: DeviceSpec) -> bool:
    """Whether at least one device of ``spec``'s type is usable here. Does not initialise the device.

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> is_available(get_spec("cpu"))
    True
    """
    if spec.host:
        return True
    try:
        module = device_module(spec)
    except DeviceNotAvailableError:
        return False
    return bool(module.is_available())


def device_count(spec: DeviceSpec) -> int:
    """How many devices of ``spec``'s type this process can see, without initialising them.

    CPU counts as one device (Lightning starts one process per requested "CPU device").

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> device_count(get_spec("cpu"))
    1
    """
    if spec.host or not is_available(spec):
        return 1 if spec.host else 0
    return int(device_module(spec).device_count())


def is_initialized(spec: DeviceSpec) -> bool:
    """Whether this process already initialised ``spec``'s device type (then ``fork`` is unsafe on most devices).

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> is_initialized(get_spec("cpu"))
    False
    """
    if spec.host:
        return False
    try:
        module = device_module(spec)
    except DeviceNotAvailableError:
        return False
    probe = getattr(module, "is_initialized", None)
    if callable(probe) and probe():
        return True
    return _lightning.is_in_bad_fork(module)


def seed(spec: DeviceSpec, value: int) -> bool:
    """Seed every generator of ``spec``'s device type with ``value`` through the device module.

    Returns whether a seeding function was found. CPU is seeded by ``torch.manual_seed``. The
    current accelerator is seeded by ``torch.accelerator.random.manual_seed_all`` where this torch
    has it, other device types by their device module's functions (``spec.seed_functions``).

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> seed(get_spec("cpu"), 0)
    False
    """
    if not spec.seed_functions:
        return False
    random = _compat.accelerator_random()
    if random is not None and _is_current(spec):
        random.manual_seed_all(value)
        return True
    module = device_module(spec)
    for name in spec.seed_functions:
        fn = getattr(module, name, None)
        if callable(fn):
            fn(value)
            return True
    return False


def global_seed() -> int | None:
    """The seed set by :func:`lightning.seed_everything` in this process tree, if any."""
    value = os.environ.get("PL_GLOBAL_SEED")
    return int(value) if value is not None else None


def memory_stats(spec: DeviceSpec, index: int | None = None) -> dict[str, Any]:
    """Memory statistics of device ``index`` of ``spec``'s type, for :class:`~lightning.pytorch.callbacks.DeviceStatsMonitor`.

    The source follows the spec: ``torch.accelerator.memory_stats`` for the current accelerator
    where the device answers it, else the device module's ``memory_stats`` (none: empty), MPS's own
    counters, and host memory/CPU load for ``cpu``. ``index=None``: the current device.

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> "cpu_percent" in memory_stats(get_spec("cpu"))
    True
    """
    source = spec.memory_stats
    if source == "cpu":
        from lightning.pytorch.accelerators.cpu import get_cpu_stats

        return dict(get_cpu_stats())
    module = device_module(spec)
    if source == "mps":
        return {
            "allocated_bytes": module.current_allocated_memory(),
            "driver_allocated_bytes": module.driver_allocated_memory(),
        }
    stats = _compat.accelerator_function("memory_stats")
    if source == "accelerator" and stats is not None and _is_current(spec):
        try:
            return dict(stats(index))
        except (RuntimeError, NotImplementedError):  # the device does not answer torch.accelerator: ask its module
            pass
    module_stats = getattr(module, "memory_stats", None)
    where = torch.device(spec.type) if index is None else torch.device(spec.type, index)
    return dict(module_stats(where)) if callable(module_stats) else {}


def empty_cache(spec: DeviceSpec) -> None:
    """Release cached, unused memory of ``spec``'s device type back to the driver (no-op on CPU)."""
    if spec.host or not is_available(spec):
        return
    accelerator_empty_cache = _compat.accelerator_function("empty_cache")
    if accelerator_empty_cache is not None and _is_current(spec):
        accelerator_empty_cache()
        return
    fn = getattr(device_module(spec), "empty_cache", None)
    if callable(fn):
        fn()


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says a device ran out of memory, whatever the device.

    ``torch.OutOfMemoryError`` is what torch's caching allocators raise (CUDA, XPU) and what vendors'
    allocators built on torch's raise; a vendor plugin that raises a plain ``RuntimeError`` says "out of
    memory" in its message ("NPU out of memory. Tried to allocate ..."). Lightning's own test
    (``is_oom_error``) wants "CUDA" in the message.

    Example:
        >>> is_out_of_memory(torch.OutOfMemoryError("XPU out of memory. Tried to allocate 2.00 GiB."))
        True
        >>> is_out_of_memory(RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB."))
        True
        >>> is_out_of_memory(RuntimeError("Expected all tensors to be on the same device"))
        False
    """
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return (isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str)
            and "out of memory" in error.args[0].lower())


def set_device_index(spec: DeviceSpec, index: int | None) -> None:
    """Make device ``index`` of ``spec``'s type the current device of this process (no-op on CPU and for ``None``)."""
    if spec.host or index is None:
        return
    set_index = _compat.accelerator_function("set_device_index")
    if set_index is not None and _is_current(spec):
        set_index(index)
    else:
        device_module(spec).set_device(index)


def _is_current(spec: DeviceSpec) -> bool:
    """Whether ``spec``'s type is the accelerator ``torch.accelerator`` speaks for (the fast path)."""
    current = torch.accelerator.current_accelerator()
    return current is not None and current.type == spec.type
