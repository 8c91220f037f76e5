"""The table of strategy families: what the package's public modules and its registration derive from.

A strategy family is one module of :mod:`lightning_anyaccel.strategies` (its steps, ``SETUP``, a
mixin, the Trainer class and the Fabric class) and one row of :data:`FAMILIES`: its name, the
Trainer class, the Fabric class and the names it registers with each front end. The Trainer's
classes are published by :mod:`lightning_anyaccel.strategies` (and the package's root), Fabric's
by :mod:`lightning_anyaccel.fabric.strategies` under their ``__name__`` (where pickle finds them),
both again for ``pytorch_lightning`` by :mod:`lightning_anyaccel.pytorch_lightning` and
:mod:`lightning_anyaccel.lightning_fabric`, and :mod:`lightning_anyaccel.registration` registers
each row's names with each front end: all from this table.

Example:
    >>> [family.name for family in FAMILIES]
    ['single', 'ddp', 'fsdp', 'model_parallel', 'deepspeed']
    >>> ddp = FAMILIES[1]
    >>> ddp.trainer.__name__, ddp.fabric.__module__, ddp.fabric.__name__
    ('AnyDDPStrategy', 'lightning_anyaccel.fabric.strategies', 'AnyDDPStrategy')
    >>> "any_ddp_notebook" in ddp.names
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_anyaccel.strategies import ddp, deepspeed, fsdp, model_parallel, single
from lightning_anyaccel.strategies.base import Registered


@dataclass(frozen=True)
class Family:
    """One strategy family.

    Args:
        name: the family's module in :mod:`lightning_anyaccel.strategies`.
        trainer: its Trainer class.
        fabric: its Fabric class (its ``__name__`` is its public name in :mod:`lightning_anyaccel.fabric`).
        names: the names it registers with each front end, each with its description and arguments.
    """

    name: str
    trainer: type
    fabric: type
    names: Mapping[str, Registered]

    def register(self, cls: type, strategy_registry: Any) -> None:
        """Register :attr:`names` for ``cls`` (the family's class for one front end) in that front end's registry."""
        for name, (description, arguments) in self.names.items():
            strategy_registry.register(name, cls, description=description, override=True, **arguments)


#: Every strategy family, in registration order.
FAMILIES: tuple[Family, ...] = (
    Family("single", single.AnySingleDeviceStrategy, single.FabricSingleDeviceStrategy, single.NAMES),
    Family("ddp", ddp.AnyDDPStrategy, ddp.FabricDDPStrategy, ddp.NAMES),
    Family("fsdp", fsdp.AnyFSDPStrategy, fsdp.FabricFSDPStrategy, fsdp.NAMES),
    Family("model_parallel", model_parallel.AnyModelParallelStrategy, model_parallel.FabricModelParallelStrategy,
           model_parallel.NAMES),
    Family("deepspeed", deepspeed.AnyDeepSpeedStrategy, deepspeed.FabricDeepSpeedStrategy, deepspeed.NAMES),
)


def trainer_strategies() -> dict[str, type]:
    """The Trainer's strategy classes by name (what :mod:`lightning_anyaccel.strategies` publishes)."""
    return {family.trainer.__name__: family.trainer for family in FAMILIES}


def fabric_strategies() -> dict[str, type]:
    """Fabric's strategy classes by public name (what :mod:`lightning_anyaccel.fabric.strategies` publishes)."""
    return {family.fabric.__name__: family.fabric for family in FAMILIES}


__all__ = ["FAMILIES", "Family", "fabric_strategies", "trainer_strategies"]
