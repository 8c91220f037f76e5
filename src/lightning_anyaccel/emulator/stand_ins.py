"""The vendor's Python package of an emulated PrivateUse1 device type, stood in for (``torch_npu``, ``torch_sdaa``, ...).

Users' code, and DeepSpeed's accelerator for the type (its probe and ``import torch_<name>``), import
the package the vendor ships with the device; on the emulated device that import finds a stand-in
over the emulated ``torch.<name>``, as ``habana_frameworks.torch`` does on the emulated ``hpu``
(``builtin.py``). The package's name is the device table's ``vendor_module`` for the type.
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType

from lightning_anyaccel.emulator.names import table_fact


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
    setattr(module, name, device_module)
    module._emulated = True  # type: ignore[attr-defined]
    sys.modules.setdefault(f"{package}.{name}", device_module)
    return sys.modules.setdefault(package, module)


__all__ = ["stand_in_vendor_module"]
