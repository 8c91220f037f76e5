"""Migration shim: ``lightning_habana`` / ``lightning_teco`` names mapped onto lightning_anyaccel (nothing reimplemented).

The vendors' test files import their plugin's classes; here each name is the package's class that a
migrating user writes instead (docs/migration.md): ``HPUAccelerator`` is ``accelerator_class("hpu")``,
``SingleHPUStrategy`` is ``AnySingleDeviceStrategy``, ``HPUDDPStrategy`` ``AnyDDPStrategy``, ... and the
precision plugins build Lightning's own. Every submodule a vendor test imports
(``lightning_habana.pytorch.strategies`` ...) is made on demand and carries the same names; a name
missing here fails the import. Gaudi software the tests import (``habana_frameworks.torch.hpex``:
fused optimizers, the fp8 Transformer Engine) imports, and fails on first use with
:class:`VendorPrivateError`, so that the rest of those files runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins import DeepSpeedPrecision, HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.profilers import PyTorchProfiler
from typing_extensions import override

import lightning_anyaccel as pl_any
import lightning_anyaccel.fabric as fab_any


class VendorPrivateError(RuntimeError):
    """A vendor's private software (Gaudi's hpex) was used: not a Lightning behaviour, not offered."""


def _precision(device: str, precision: str = "32-true") -> Precision:
    """What ``HPUPrecisionPlugin(precision=...)`` becomes: Lightning's plugin for the name, on ``device``.

    Lightning refuses a name it does not know (lightning-teco's ``"fp16-mixed"``); ``fp8`` is Gaudi software.
    """
    name = {"bf16": "bf16-mixed", "16": "16-mixed", "32": "32-true"}.get(str(precision), str(precision))
    if name == "fp8":
        raise VendorPrivateError("precision 'fp8' is Intel Gaudi's Transformer Engine, not offered by lightning-anyaccel")
    if name == "32-true":
        return Precision()
    if name.endswith("-true"):
        return HalfPrecision(name)  # type: ignore[arg-type]
    # Lightning's MixedPrecision refuses any other name, naming its own
    return MixedPrecision(name, device, scaler=torch.amp.GradScaler(device) if name == "16-mixed" else None)  # type: ignore[arg-type]


def _precision_plugin(device: str) -> Any:
    """``HPUPrecisionPlugin``: a function returning Lightning's plugin (:func:`_precision`), no class of its own, so
    ``isinstance(plugin, HPUPrecisionPlugin)`` fails; LightningCLI takes it as a class path (it returns a
    ``Precision``)."""

    def make(precision: str = "32-true", **kwargs: Any) -> Precision:
        return _precision(device, precision)

    return make


def _names(device: str, prefix: str) -> dict[str, Any]:
    acc = pl_any.accelerator_class(device)
    up = prefix.upper()
    return {
        f"{up}Accelerator": acc,
        f"Single{up}Strategy": pl_any.AnySingleDeviceStrategy,
        f"{up}DDPStrategy": pl_any.AnyDDPStrategy,
        f"{up}ParallelStrategy": pl_any.AnyDDPStrategy,
        f"{up}FSDPStrategy": pl_any.AnyFSDPStrategy,
        f"{up}DeepSpeedStrategy": pl_any.AnyDeepSpeedStrategy,
        f"{up}PrecisionPlugin": _precision_plugin(device),
        f"{up}FSDPPrecision": pl_any.AnyFSDPPrecision,
        f"{up}DeepSpeedPrecisionPlugin": DeepSpeedPrecision,
        f"{up}CheckpointIO": TorchCheckpointIO,
        f"{up}Profiler": PyTorchProfiler,
        f"{up}_AVAILABLE": acc.is_available(),
        f"_{up}_DEEPSPEED_AVAILABLE": True,
        "_PRECISION_INPUT": str,
        "_LIGHTNING_GREATER_EQUAL_2_3_0": True,
        # Gaudi facts the tests read to pick a branch: a Gaudi 2 with a recent software stack
        "get_device_name_from_hlsmi": lambda: "GAUDI2",
        "get_hpu_synapse_version": lambda: "1.19.0",
        "supported_reduce_ops": ["sum", "min", "max"],  # HCCL's list (a Gaudi fact)
        "device_count": acc.auto_device_count,
        f"num_{prefix}_devices": acc.auto_device_count,
    }


def _fabric_names(device: str, prefix: str) -> dict[str, Any]:
    up = prefix.upper()
    return {
        f"{up}Accelerator": fab_any.AnyAccelerator.bound(device),
        f"Single{up}Strategy": fab_any.AnySingleDeviceStrategy,
        f"{up}DDPStrategy": fab_any.AnyDDPStrategy,
        f"{up}ParallelStrategy": fab_any.AnyDDPStrategy,
        f"{up}FSDPStrategy": fab_any.AnyFSDPStrategy,
        f"{up}FSDPPrecision": fab_any.AnyFabricFSDPPrecision,
    }


_ROOTS = {"lightning_habana": ("hpu", "hpu"), "lightning_teco": ("sdaa", "sdaa")}

# The modules the vendors' tests import (and their parents); habana's data module is Gaudi software,
# left out so that its import fails.
_IMPORTED = """lightning_habana.fabric.accelerator lightning_habana.fabric.plugins.fsdp_precision
lightning_habana.fabric.strategies.ddp lightning_habana.fabric.strategies.fsdp lightning_habana.fabric.strategies.single
lightning_habana.pytorch.accelerator lightning_habana.pytorch.plugins.fsdp_precision lightning_habana.pytorch.strategies
lightning_habana.pytorch.plugins.io_plugin lightning_habana.pytorch.plugins.precision lightning_habana.pytorch.profiler.profiler
lightning_habana.pytorch.strategies.deepspeed lightning_habana.utils.imports lightning_habana.utils.resources
lightning_habana.utils.hpu_distributed lightning_teco.pytorch.accelerator lightning_teco.pytorch.plugins.fsdp_precision
lightning_teco.pytorch.plugins.io_plugin lightning_teco.pytorch.plugins.precision lightning_teco.pytorch.strategies
lightning_teco.utils.resources""".split()
_MODULES = {".".join(m.split(".")[:i]) for m in _IMPORTED for i in range(2, m.count(".") + 2)}
_VENDOR_PRIVATE = "habana_frameworks.torch.hpex"
#: The vendor's data files a test reads (its fp8 configurations): found in the checkout the test runs from.
_VENDOR_DATA = "lightning_habana.pytorch.plugins.quant_config"


class _Private:
    """A name of Gaudi software (``tengine.recipe.DelayedScaling``): may be named (a test's parameters are
    collected), refuses every use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Private(f"{self._name}.{attr}")

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise VendorPrivateError(f"{self._name} is Intel Gaudi software (hpex), not offered by lightning-anyaccel")

    __call__ = __instancecheck__ = __enter__ = __iter__ = __bool__ = _refuse


class _PrivateModule(types.ModuleType):
    """A module of Gaudi software: imports; its names are :class:`_Private`."""

    @override
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Private(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    @override
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(_VENDOR_DATA):  # importlib.resources reads the folder of the spec's origin
            origin = Path.cwd() / "src" / Path(*fullname.split(".")) / "__init__.py"
            return importlib.machinery.ModuleSpec(fullname, self, origin=str(origin), is_package=True)
        if fullname in _MODULES or fullname == _VENDOR_PRIVATE or fullname.startswith(_VENDOR_PRIVATE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    @override
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return _PrivateModule(spec.name) if spec.name.startswith(_VENDOR_PRIVATE) else None

    @override
    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        if isinstance(module, _PrivateModule) or module.__name__.startswith(_VENDOR_DATA):
            return
        device, prefix = _ROOTS[module.__name__.split(".")[0]]
        module.__dict__.update(_names(device, prefix))
        if ".fabric" in module.__name__:
            module.__dict__.update(_fabric_names(device, prefix))


sys.meta_path.insert(0, _Finder())


def populate(namespace: dict[str, Any], root: str) -> None:
    """Fill a root package (``lightning_habana``) with the mapped names."""
    namespace.update(_names(*_ROOTS[root]))
