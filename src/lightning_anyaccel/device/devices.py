"""What the package knows about each device type: derived from PyTorch, refined by a table of known facts.

Any device type PyTorch reports works with no code: :func:`get_spec` derives a :class:`DeviceSpec`
from torch itself (:func:`derive_spec`: the collective backend from torch's device-to-backend map
and backend registrations, autocast dtypes from ``torch.amp`` and the device module, seeding,
memory statistics, fork safety and the vendor module from the device module). :data:`DEVICE_TABLE`
holds what torch can not tell: known facts and quirks of the device types the project has met
(HPU's ``fake`` backend, the vendor packages to import, FSDP's offload crash on CPU, ...). Its
entries refine the derived spec; they are not a whitelist. Every class in
:mod:`lightning_anyaccel` asks :func:`get_spec` instead of branching on device names, and the
documentation's support matrix is generated from the table, so code and docs cannot drift.
:func:`register_device` adds or replaces an entry at runtime.

Example:
    >>> from lightning_anyaccel.device.devices import get_spec
    >>> get_spec("xpu").backend
    'xccl'
    >>> get_spec("cpu").autocast_dtypes
    ('bf16', 'fp16')
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from lightning_anyaccel import _lightning
from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.device.table import DEVICE_TABLE

#: Called with the spec on every :func:`register_device` (the registration module adds the accelerator name).
_ON_REGISTER: list[Callable[[DeviceSpec], None]] = []

#: The answers of :func:`get_spec`: device type -> (what torch said when it was derived, the spec).
_SPECS: dict[str, tuple[tuple[Any, ...], DeviceSpec | None]] = {}

#: Backends that never carry real collectives.
NOT_REAL_BACKENDS = frozenset({"fake", "undefined"})

#: torch dtype -> the name :attr:`DeviceSpec.autocast_dtypes` uses.
_DTYPE_NAMES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def on_register(callback: Callable[[DeviceSpec], None]) -> None:
    """Call ``callback(spec)`` on every later :func:`register_device` (once per callback)."""
    if callback not in _ON_REGISTER:
        _ON_REGISTER.append(callback)


def register_device(spec: DeviceSpec) -> None:
    """Add or replace the known facts of a device type at runtime, and register its ``accelerator=`` name.

    Not needed for a device PyTorch reports (:func:`derive_spec` describes it); use it to
    correct what torch reports wrongly, or for a device type torch does not know yet.

    >>> register_device(DeviceSpec(type="mydevice", name="My device", backend="myccl", autocast_dtypes=("bf16",)))
    >>> get_spec("mydevice").backend
    'myccl'
    >>> del DEVICE_TABLE["mydevice"]
    """
    DEVICE_TABLE[spec.type] = spec
    _SPECS.clear()
    for callback in list(_ON_REGISTER):
        callback(spec)


# ------------------------------------------------------------------------------ what torch knows


def privateuse1_name() -> str | None:
    """The name a vendor gave torch's PrivateUse1 backend in this process, or ``None`` when none did.

    >>> privateuse1_name() is None or isinstance(privateuse1_name(), str)
    True
    """
    name = torch.device("privateuseone").type  # torch answers with the renamed type
    return None if name == "privateuseone" else name


def torch_device_module(device_type: str) -> Any:
    """``torch.get_device_module(device_type)``, or ``None`` where torch has no module for the type.

    >>> torch_device_module("cpu").__name__
    'torch.cpu'
    >>> torch_device_module("nosuch") is None
    True
    """
    try:
        torch.device(device_type)
        return torch.get_device_module(device_type)
    except (RuntimeError, AttributeError, ImportError, ValueError):
        return None


def present_device_types() -> list[str]:
    """Device types this process has beyond the built-in CPU: torch's current accelerator and a renamed PrivateUse1.

    Does not initialise a device.

    >>> "cpu" not in present_device_types()
    True
    """
    found = []
    current = torch.accelerator.current_accelerator()
    if current is not None:
        found.append(current.type)
    renamed = privateuse1_name()
    if renamed and renamed not in found and torch_device_module(renamed) is not None:
        found.append(renamed)
    return found


def derive_backend(device_type: str) -> str | None:
    """The collective backend torch has for ``device_type``: its default map, else a backend registered for it.

    A backend counts only where torch's capability table says it carries the device's tensors
    (the map says ``gloo`` for ``mps``, which gloo can not carry); ``fake``/``undefined`` never count.

    >>> derive_backend("cpu"), derive_backend("mps"), derive_backend("nosuch")
    ('gloo', None, None)
    """
    import torch.distributed as dist

    if not dist.is_available():
        return None
    capability = dist.Backend.backend_capability
    mapped = dist.Backend.default_device_backend_map.get(device_type)
    if mapped and mapped not in NOT_REAL_BACKENDS and device_type in capability.get(mapped, [device_type]):
        return mapped
    return next((name for name, devices in capability.items()
                 if device_type in devices and name not in NOT_REAL_BACKENDS and name != "gloo"), None)


def derive_autocast_dtypes(device_type: str, module: Any) -> tuple[str, ...]:
    """The autocast dtypes ``torch.autocast(device_type)`` really accepts, preferred first.

    ``torch.amp.is_autocast_available`` is true for every PrivateUse1 backend; ``torch.autocast``
    then asks the device module's ``get_amp_supported_dtype`` (and fails with an ``AssertionError``
    where it is missing), so that function decides. Built-in device types autocast bf16 and fp16.

    >>> derive_autocast_dtypes("cpu", torch_device_module("cpu"))
    ('bf16', 'fp16')
    """
    try:
        if not torch.amp.is_autocast_available(device_type):
            return ()
    except RuntimeError:  # a type this torch does not parse
        return ()
    probe = getattr(module, "get_amp_supported_dtype", None)
    if callable(probe):
        try:
            supported = set(probe())
        except Exception:  # noqa: BLE001 - a device module that fails to answer supports nothing we can use
            return ()
        return tuple(name for dtype, name in _DTYPE_NAMES.items() if dtype in supported)
    if device_type == privateuse1_name():
        return ()
    return tuple(_DTYPE_NAMES.values())


def vendor_of(module: Any) -> str | None:
    """The top-level package that provides a device module (``torch_npu`` for ``torch.npu``), or ``None`` for torch's own.

    A module its vendor named ``torch.<type>`` is traced through the module most of its functions come from.

    >>> vendor_of(torch_device_module("cpu")) is None
    True
    """
    if module is None:
        return None
    name = getattr(module, "__name__", None) or type(module).__module__
    top = name.split(".")[0]
    if top not in ("torch", "types", "builtins"):
        return top
    origins = collections.Counter(
        origin.split(".")[0] for value in getattr(module, "__dict__", {}).values()
        if callable(value) and isinstance(origin := getattr(value, "__module__", None), str)
    )
    most_common = origins.most_common(1)
    return most_common[0][0] if most_common and most_common[0][0] != "torch" else None


def derive_spec(device_type: str) -> DeviceSpec | None:
    """A :class:`DeviceSpec` from what torch knows about ``device_type``; ``None`` where torch does not know it.

    Asks torch only (no device is initialised): the device module, ``torch.amp``, the
    distributed backend registrations and the PrivateUse1 name.

    >>> spec = derive_spec("cpu")
    >>> spec.backend, spec.autocast_dtypes, spec.seed_functions
    ('gloo', ('bf16', 'fp16'), ())
    >>> derive_spec("nosuch") is None
    True
    """
    module = torch_device_module(device_type)
    if module is None:
        return None
    private_use1 = device_type == privateuse1_name()
    vendor = vendor_of(module)
    return DeviceSpec(
        type=device_type,
        name=f"{device_type.upper()} device" + (f" ({vendor})" if vendor else ""),
        backend=derive_backend(device_type),
        autocast_dtypes=derive_autocast_dtypes(device_type, module),
        vendor_module=vendor,
        install=f"the PyTorch package that provides `torch.{device_type}`" + (f" ({vendor})" if vendor else ""),
        private_use1=private_use1,
        seeded_by_torch=private_use1 and callable(getattr(module, "manual_seed_all", None)),
        seed_functions=tuple(name for name in ("manual_seed_all", "manual_seed")
                             if callable(getattr(module, name, None)) and not is_host(device_type)),
        memory_stats="accelerator",
        fork_safe_after_init=not _lightning.has_bad_fork_check(module),
        profiler_activity="PrivateUse1" if private_use1 else None,
        notes="Derived from PyTorch at runtime (no entry in the device table).",
    )


def refine(derived: DeviceSpec | None, known: DeviceSpec | None) -> DeviceSpec | None:
    """Merge the table's known facts over the derived spec.

    The table's facts win (a backend torch maps wrongly, the vendor package to import); what the
    device can do is what both allow: the autocast dtypes are the table's that this torch and
    device module accept.

    >>> refine(None, DEVICE_TABLE["npu"]) is DEVICE_TABLE["npu"]
    True
    >>> narrowed = dataclasses.replace(derive_spec("cpu"), autocast_dtypes=("bf16",))
    >>> refine(narrowed, DEVICE_TABLE["cpu"]).autocast_dtypes
    ('bf16',)
    """
    if derived is None or known is None:
        return known or derived
    dtypes = tuple(name for name in known.autocast_dtypes if name in derived.autocast_dtypes)
    return known if dtypes == known.autocast_dtypes else dataclasses.replace(known, autocast_dtypes=dtypes)


def known_device_types() -> list[str]:
    """Every device type :func:`get_spec` answers for without raising: the table's (sorted), then those present here.

    >>> "cpu" in known_device_types() and "hpu" in known_device_types()
    True
    """
    return sorted(DEVICE_TABLE) + [t for t in present_device_types() if t not in DEVICE_TABLE]


def is_host(device_type: str | None) -> bool:
    """Whether ``device_type`` is the host itself (:attr:`DeviceSpec.host`: CPU; ``None``: not known, no).

    >>> is_host("cpu"), is_host("xpu")
    (True, False)
    """
    spec = DEVICE_TABLE.get(device_type) if device_type is not None else None
    return spec is not None and spec.host


def device_of(device_type: str, index: int = 0) -> torch.device:
    """Device ``index`` of ``device_type`` (``xpu:1``); the host has one unnumbered device (``cpu``).

    >>> device_of("xpu", 1), device_of("cpu", 1)
    (device(type='xpu', index=1), device(type='cpu'))
    """
    known = DEVICE_TABLE.get(device_type)
    return known.device(index) if known is not None else torch.device(device_type, index)


def _torch_state(device_type: str) -> tuple[Any, ...]:
    """What a derived spec of ``device_type`` depends on that can change in a running process.

    A vendor package imported later (it renames PrivateUse1, registers its device module and its
    backend) or an entry of the table replaced changes it, so :func:`get_spec` derives again.
    """
    import torch.distributed as dist

    backends = (tuple(sorted((name, tuple(types)) for name, types in dist.Backend.backend_capability.items())),
                dist.Backend.default_device_backend_map.get(device_type)) if dist.is_available() else ()
    return (DEVICE_TABLE.get(device_type), torch_device_module(device_type), privateuse1_name(),
            torch.amp.is_autocast_available, backends)


def get_spec(device_type: str) -> DeviceSpec:
    """The :class:`DeviceSpec` for ``device_type``: derived from torch (:func:`derive_spec`), refined by the table.

    Derived once and kept (:func:`register_device` forgets what was kept) while torch says the same
    about the device type.

    Raises a ``ValueError`` only for a type that neither torch nor the table knows, listing the
    known ones and saying how to add one.

    >>> get_spec("hpu").name
    'Intel Gaudi (HPU)'
    """
    state = _torch_state(device_type)
    cached = _SPECS.get(device_type)
    if cached is not None and cached[0] == state:
        spec = cached[1]
    else:
        spec = refine(derive_spec(device_type), DEVICE_TABLE.get(device_type))
        _SPECS[device_type] = (state, spec)
    if spec is None:
        known = ", ".join(known_device_types())
        raise ValueError(
            f"Unknown device type {device_type!r}. Known device types: {known}."
            " PyTorch in this environment does not know it either: install and import the vendor's PyTorch"
            " package for it, pass one of these, or describe a new one with"
            " `lightning_anyaccel.device.devices.register_device(DeviceSpec(...))`."
        )
    return spec
