"""Registers the package with each Lightning package: names, classes and the strategy policy.

``import lightning_anyaccel`` registers with ``lightning`` (Trainer and Fabric) at once, and with
``pytorch_lightning`` (Trainer) and ``lightning_fabric`` (Fabric) as soon as they are imported,
before or after the package, so ``import pytorch_lightning as pl`` works in any order. For each
front end that means:

- the accelerator names (``"any"``, ``"xpu"``, ``"hpu"``, ..., every device type present at import
  and every later :func:`~lightning_anyaccel.device.devices.register_device`) and strategy names (``"any_single"``,
  ``"any_ddp"``, ..., ``"any_deepspeed_stage_3_offload"``) in its registries, bound to the
  package's classes built for that front end (:func:`lightning_anyaccel._lightning.port`);
- the connector hooks through which :mod:`lightning_anyaccel.wiring.policy` picks the package's
  strategies for the package's accelerator;
- for the Trainer, the hook through which Lightning's batch-size finder recognises every device's
  out-of-memory error (:func:`lightning_anyaccel.device.runtime.is_out_of_memory`).

Example:
    >>> import lightning_anyaccel
    >>> from lightning.pytorch.strategies import StrategyRegistry
    >>> "any_ddp" in StrategyRegistry and "any_fsdp2" in StrategyRegistry
    True
    >>> registered_front_ends()[0]
    ('lightning', 'trainer')
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from _lightning_anyaccel_import_hook import when_imported
from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning import LIGHTNING, PYTORCH_LIGHTNING, Distribution
from lightning_anyaccel.device import devices, runtime
from lightning_anyaccel.wiring import activation

_REGISTERED: list[tuple[str, str]] = []


def trainer_classes() -> list[type]:
    """The package's Trainer-side classes as written (for ``lightning``), in registration order."""
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO
    from lightning_anyaccel.checkpoints.preemption import PreemptionCheckpoint
    from lightning_anyaccel.cluster.environments import AnyMPIEnvironment
    from lightning_anyaccel.device.sharded_precision import AnyFSDPPrecision
    from lightning_anyaccel.strategies.families import FAMILIES
    from lightning_anyaccel.strategies.process_launchers import AnyMultiProcessingLauncher

    return [AnyAccelerator, *(family.trainer for family in FAMILIES), AnyMultiProcessingLauncher, AnyMPIEnvironment,
            AtomicCheckpointIO, AnyFSDPPrecision, PreemptionCheckpoint]


def fabric_classes() -> list[type]:
    """The package's Fabric-side classes as written (for ``lightning.fabric``), in registration order."""
    from lightning_anyaccel.device.sharded_precision import AnyFabricFSDPPrecision
    from lightning_anyaccel.strategies.families import FAMILIES
    from lightning_anyaccel.strategies.process_launchers import FabricMultiProcessingLauncher

    return [*(family.fabric for family in FAMILIES), FabricMultiProcessingLauncher, AnyFabricFSDPPrecision]


#: Per side: (module and name of the accelerator registry, of the strategy registry, the connector, the classes).
_SIDES: dict[str, tuple[str, str, str, str, str, Callable[[], list[type]]]] = {
    "trainer": ("lightning.pytorch.accelerators", "AcceleratorRegistry", "lightning.pytorch.strategies",
                "StrategyRegistry", _lightning.TRAINER_CONNECTOR, trainer_classes),
    "fabric": ("lightning.fabric.accelerators", "ACCELERATOR_REGISTRY", "lightning.fabric.strategies",
               "STRATEGY_REGISTRY", _lightning.FABRIC_CONNECTOR, fabric_classes),
}


def register_trainer(distribution: Distribution) -> None:
    """Register the accelerator and strategy names and the policy with ``distribution``'s Trainer (once)."""
    _register(distribution, "trainer")


def register_fabric(distribution: Distribution) -> None:
    """Register the accelerator and strategy names and the policy with ``distribution``'s Fabric (once)."""
    _register(distribution, "fabric")


def _register(distribution: Distribution, side: str) -> None:
    if (distribution.package, side) in _REGISTERED:
        return
    _REGISTERED.append((distribution.package, side))
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.strategies.families import FAMILIES
    from lightning_anyaccel.wiring.policy import POLICY

    accelerator_module, accelerator_registry, strategy_module, strategy_registry, connector, classes = _SIDES[side]
    accelerators = getattr(distribution.module(accelerator_module), accelerator_registry)
    strategies = getattr(distribution.module(strategy_module), strategy_registry)
    ported_accelerator = _lightning.port(AnyAccelerator, distribution)
    ported_accelerator.register_accelerators(accelerators)
    devices.on_register(lambda spec: ported_accelerator.register_device_type(accelerators, spec))
    for cls in classes():
        _lightning.port(cls, distribution)
    for family in FAMILIES:
        family.register(_lightning.port(family.trainer if side == "trainer" else family.fabric, distribution), strategies)
    _lightning.install_connector_hooks(distribution, connector, POLICY)
    if activation.is_active():
        activation.record_strategy_arguments(distribution, side)
    if side == "trainer":
        _lightning.install_device_info_hook(distribution, POLICY)
        _lightning.install_profiler_hook(distribution, POLICY)
        _lightning.install_out_of_memory_hook(distribution, runtime.is_out_of_memory)


def registered_front_ends() -> list[tuple[str, str]]:
    """``(package, "trainer" | "fabric")`` for every front end registered so far, in order."""
    return list(_REGISTERED)


def ported(module: str, name: str) -> type:
    """The class ``name`` of :mod:`lightning_anyaccel.pytorch_lightning` or ``.lightning_fabric``, ported on demand.

    What those modules' ``__getattr__`` answers (pickle finds ported classes through it in
    ``spawn`` children).
    """
    for cls in trainer_classes() + fabric_classes():
        if cls.__name__ == name:
            candidate = _lightning.port(cls, PYTORCH_LIGHTNING)
            if candidate.__module__ == module:
                return candidate
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def register() -> None:
    """Register with ``lightning`` now, and with ``pytorch_lightning``/``lightning_fabric`` once imported."""
    register_trainer(LIGHTNING)
    register_fabric(LIGHTNING)
    _when_imported("lightning_fabric", lambda: _register_standalone_fabric())
    _when_imported("pytorch_lightning", _register_pytorch_lightning)


def _register_pytorch_lightning() -> None:
    register_trainer(PYTORCH_LIGHTNING)
    register_fabric(PYTORCH_LIGHTNING)


def _register_standalone_fabric() -> None:
    if "pytorch_lightning" in sys.modules and (PYTORCH_LIGHTNING.package, "trainer") not in _REGISTERED:
        return  # pytorch_lightning is importing lightning_fabric: its own hook registers both, once it is complete
    register_fabric(PYTORCH_LIGHTNING)


def _when_imported(name: str, callback: Callable[[], Any]) -> None:
    """Run ``callback`` once module ``name`` is imported: now if it is, else right after its import (if installed)."""
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        when_imported(name, callback)


__all__ = ["fabric_classes", "ported", "register", "register_fabric", "register_trainer", "registered_front_ends",
           "trainer_classes"]
