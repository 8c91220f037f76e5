"""The emulated device's names and the specs that describe it (``npu``, ``emu:4``, ``acme:2:noavg,memory=1GiB``)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

#: The environment variable the autoload hook reads (``npu``, ``mlu``, ``emu:4`` for 4 devices,
#: ``acme:2:noshallow,noautocast`` for 2 devices of a lesser backend, ``acme:2:memory=256MiB`` for 2
#: devices of 256 MiB each).
ENV_VAR = "LIGHTNING_ANYACCEL_EMULATE"

#: What each emulated device holds unless ``memory_bytes``/``memory=SIZE`` says otherwise: past it,
#: allocation raises ``torch.OutOfMemoryError``. Address space only: host memory is used as tensors use it.
DEFAULT_MEMORY_BYTES = 16 << 30

#: The smallest capacity a device can have (``memory=SIZE``): the allocator's large segments are 2 MiB
#: (``kLargeSegment`` in ``csrc/emulator.cpp``, which refuses less).
MIN_MEMORY_BYTES = 2 << 20

#: The collective backend registered for an emulated device type the device table does not know.
#: A known type's gets its vendor's name (:func:`backend_name`), as code and tests that check the
#: name expect; the records say what ran (the emulator, not a vendor library).
BACKEND = "emuccl"

#: ``NAME:COUNT:OPTION,OPTION`` options: what the backend lacks, as some vendors' backends do.
OPTIONS: dict[str, str] = {
    "noshallow": "tensors can not be shallow-copied into CPU tensors (`aten::_has_compatible_shallow_copy_type` is"
                 " False): `module.to(device)` replaces parameters instead of moving them in place",
    "noautocast": "the device module has no `get_amp_supported_dtype`/`is_bf16_supported`: `torch.autocast` fails",
    "nocollectives": "no collective backend is registered for the device type",
    "noprofiler": "no activity profiler is registered for the device: torch.profiler records the host only",
    "noavg": "the collective backend refuses `ReduceOp.AVG` when it is called, as some vendors' libraries do (a"
             " mean is a sum divided by the group's size there)",
}

#: Device types torch builds in that the emulator serves on their own dispatch keys (no rename).
BUILTIN_TYPES = ("xpu", "hpu")

#: The vendors' collective backends of the built-in types, which the emulator provides under
#: their names: ``hccl`` registered as Habana's bridge registers it, ``xccl`` through a stand-in of
#: torch's own ``ProcessGroupXCCL`` binding (see ``_stand_in_process_group_xccl``).
VENDOR_BACKENDS = {"hpu": "hccl", "xpu": "xccl"}


def backend_name(device_type: str) -> str:
    """The collective backend name registered for the emulated ``device_type``: its vendor's, else ``emuccl``.

    >>> backend_name("sdaa"), backend_name("mlu"), backend_name("acme")
    ('tccl', 'cncl', 'emuccl')
    """
    known = table_fact(device_type, "backend") if device_type not in VENDOR_BACKENDS else None
    return VENDOR_BACKENDS.get(device_type) or known or BACKEND


def table_fact(device_type: str, field: str) -> str | None:
    """A string field of ``device_type``'s row in the device table (``device/table.py``), or ``None``.

    The table is read as data: importing it would import the package and Lightning, which a
    process the autoload hook starts never pays for.

    >>> table_fact("npu", "vendor_module"), table_fact("acme", "backend")
    ('torch_npu', None)
    """
    return _table_rows().get(device_type, {}).get(field)


@functools.cache
def _table_rows() -> dict[str, dict[str, str]]:
    tree = ast.parse((Path(__file__).resolve().parents[2] / "device" / "table.py").read_text())
    rows: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DeviceSpec":
            fields = {k.arg: k.value.value for k in node.keywords
                      if k.arg and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
            if "type" in fields:
                rows[fields["type"]] = fields
    return rows


def parse_spec(spec: str) -> tuple[str, int]:
    """``"npu"`` -> ``("npu", 2)``, ``"emu:4"`` -> ``("emu", 4)`` (options, a third field, are :func:`parse_options`'s).

    A count that is not a whole number of at least 1 raises ``ValueError``, naming the forms read.
    """
    name, _, rest = spec.partition(":")
    count = rest.partition(":")[0].strip()
    if count and not (count.isdigit() and int(count) >= 1):
        raise ValueError(f"the device count {count!r} in {spec!r} is not a whole number of at least 1;"
                         " write e.g. npu:2 (two devices) or xpu:1")
    return name.strip(), int(count) if count else 2


def check_spec(spec: str) -> tuple[str, int, frozenset[str], int | None]:
    """Name, count, options and memory of ``spec``, checked before anything loads; ``ValueError`` says what is wrong.

    The name is ``xpu``, ``hpu`` or a name of one's own (letters, digits, ``_``; not a device type torch builds
    in, such as ``cuda`` or ``mps``); the count at least 1; the memory at least :data:`MIN_MEMORY_BYTES`.
    """
    name, count = parse_spec(spec)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"the device name {name!r} in {spec!r} is not a device type: write a lower-case name of"
                         " letters, digits and _ (npu, mlu, xpu, hpu, ...)")
    if name not in BUILTIN_TYPES and _is_torch_type(name):
        raise ValueError(f"{name!r} is a device type torch builds in, which the emulator can not be: emulate"
                         f" {' or '.join(BUILTIN_TYPES)}, or a name of your own (npu, mlu, ...)")
    memory = parse_memory_bytes(spec)
    if memory is not None and memory < MIN_MEMORY_BYTES:
        raise ValueError(f"a device of {memory} bytes ({spec!r}) is below the smallest the emulator makes,"
                         f" {MIN_MEMORY_BYTES >> 20} MiB: ask for e.g. 64MiB")
    return name, count, parse_options(spec), memory


def _is_torch_type(name: str) -> bool:
    """Whether torch parses ``name`` as one of its own device types (not this process's PrivateUse1 name)."""
    import torch

    if name == torch._C._get_privateuse1_backend_name():
        return False
    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


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
