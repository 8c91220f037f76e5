"""The vendor's Python package of an emulated PrivateUse1 device type, stood in for (``torch_npu``, ``torch_sdaa``, ...).

Users' code, and DeepSpeed's accelerator for the type (its probe and ``import torch_<name>``), import
the package the vendor ships with the device; on the emulated device that import finds a stand-in
over the emulated ``torch.<name>``, as ``habana_frameworks.torch`` does on the emulated ``hpu``
(``builtin.py``). The package's name is the device table's ``vendor_module`` for the type.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from lightning_anyaccel.kit.emulator.names import table_fact

#: What the vendor's environment script sets and DeepSpeed's accelerator reads, per device type. Ascend's
#: ``set_env.sh`` sets ``ASCEND_HOME_PATH`` (the CANN toolkit); DeepSpeed's npu op builders read it
#: unconditionally (a ``KeyError`` without it). Here it names a folder that does not exist: no CANN,
#: so DeepSpeed builds its npu ops without it (``__DISABLE_CANN__``), as on a machine with torch_npu only.
VENDOR_ENVIRONMENT: dict[str, dict[str, str]] = {
    "npu": {"ASCEND_HOME_PATH": str(Path(__file__).resolve().parent / "no_cann_toolkit")},
}


_LEGACY_TYPES = {"BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "DoubleTensor": torch.float64,
                 "FloatTensor": torch.float32, "HalfTensor": torch.float16, "IntTensor": torch.int32,
                 "LongTensor": torch.int64}

#: The device types whose vendor package adds torch's legacy tensor types to the device module
#: (torch_npu: ``torch.npu.FloatTensor([1.0])``, which DeepSpeed's npu accelerator hands out).
LEGACY_TENSOR_TYPES = frozenset({"npu"})


#: Submodules the vendor package adds to the device module that DeepSpeed's accelerator reads, each empty here:
#: Cambricon's ``torch.mlu.cnpx`` (profiler ranges; DeepSpeed marks ranges only where it has ``range_push``).
EMPTY_SUBMODULES: dict[str, tuple[str, ...]] = {"mlu": ("cnpx",)}


def _legacy_type(name: str, device_module: ModuleType, dtype: torch.dtype) -> Any:
    """``<Type>Tensor(data)`` or ``<Type>Tensor(*sizes)`` on the current device, as torch's legacy constructors."""

    def make(*args: Any) -> torch.Tensor:
        where = torch.device(name, device_module.current_device())
        if args and all(isinstance(a, int) for a in args):
            return torch.empty(args, dtype=dtype, device=where)
        return torch.tensor(args[0] if args else [], dtype=dtype, device=where)

    return make


def stand_in_vendor_module(name: str, device_module: ModuleType) -> ModuleType | None:
    """Put a stand-in of ``name``'s vendor package in ``sys.modules`` (a real one already imported is kept).

    Returns the stand-in, or ``None`` where the device table names no package for ``name``.
    ``<package>.<name>`` is the emulated device module, as ``torch_npu.npu`` is ``torch.npu``.
    """
    package = table_fact(name, "vendor_module")
    if package is None or "." in package:
        return None
    module = ModuleType(package, f"Stand-in of {package} over the emulated {name} (lightning-anyaccel emulator).")
    module.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
    module.__path__ = []  # a package: `import torch_npu.npu` finds the attribute below first
    module.__file__ = __file__  # DeepSpeed's op builders look for the package's headers beside it
    setattr(module, name, device_module)
    module._emulated = True  # type: ignore[attr-defined]
    if name in LEGACY_TENSOR_TYPES:
        for type_name, dtype in _LEGACY_TYPES.items():
            if not hasattr(device_module, type_name):
                setattr(device_module, type_name, _legacy_type(name, device_module, dtype))
    for sub in EMPTY_SUBMODULES.get(name, ()):
        if not hasattr(device_module, sub):
            setattr(device_module, sub, ModuleType(f"torch.{name}.{sub}", f"Stand-in of torch.{name}.{sub}: empty."))
    for key, value in VENDOR_ENVIRONMENT.get(name, {}).items():
        os.environ.setdefault(key, value)
    sys.modules.setdefault(f"{package}.{name}", device_module)
    return sys.modules.setdefault(package, module)


__all__ = ["EMPTY_SUBMODULES", "LEGACY_TENSOR_TYPES", "VENDOR_ENVIRONMENT", "stand_in_vendor_module"]
