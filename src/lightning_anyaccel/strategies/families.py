"""The table of strategy families: what the package's public modules and its registration derive from.

A strategy family is one module of :mod:`lightning_anyaccel.strategies` (its steps, ``SETUP``, a
mixin, the Trainer class and the Fabric class) and one row of :data:`FAMILIES`: its name, the
Trainer class, the Fabric class and the names it registers with each front end. The Trainer's
classes are published by :mod:`lightning_anyaccel.strategies` (and the package's root), Fabric's
by :mod:`lightning_anyaccel.fabric.strategies` under their ``__name__`` (where pickle finds them),
both again for ``pytorch_lightning`` by :mod:`lightning_anyaccel.pytorch_lightning` and
:mod:`lightning_anyaccel.lightning_fabric`, and :mod:`lightning_anyaccel.wiring.registration` registers
each row's names with each front end: all from this table.

Example:
    >>> [family.name for family in FAMILIES]
    ['single', 'ddp', 'fsdp', 'model_parallel', 'deepspeed']
    >>> ddp = FAMILIES[1]
    >>> ddp.trainer.__name__, ddp.fabric.__module__, ddp.fabric.__name__
    ('AnyDDPStrategy', 'lightning_anyaccel.fabric.strategies', 'AnyDDPStrategy')
    >>> "any_ddp_notebook" in ddp.names
    True

Every other table of strategy names derives from it: :data:`EQUIVALENTS` (Lightning's registered names
the package's replace, :mod:`lightning_anyaccel.wiring.policy`), :data:`CLASS_EQUIVALENTS` (Lightning's class ->
the family's name, for refusals), :data:`PROGRAM_STRATEGIES` (the classes rebuilt under
``LIGHTNING_ANYACCEL_ACTIVATE=1``, :mod:`lightning_anyaccel.wiring.activation`), :data:`START_METHODS`,
:data:`MULTI_PROCESS_FAMILIES` and :data:`FEATURE_FAMILIES` (the support grid's strategy columns).

    >>> EQUIVALENTS["ddp_find_unused_parameters_false"], CLASS_EQUIVALENTS["FSDPStrategy"], START_METHODS["any_ddp"]
    ('any_ddp', 'any_fsdp', 'popen')

Which family the package refuses on which device type, and why, is :func:`refusal`: the rules the
strategies refuse with (:mod:`lightning_anyaccel.strategies.support`) per family, which the
documentation's device pages, support grid and migration page ask.

    >>> from lightning_anyaccel.device.devices import DEVICE_TABLE
    >>> refusal("ddp", DEVICE_TABLE["cuda"]) is None
    True
    >>> refusal("fsdp", DEVICE_TABLE["mps"])
    'Apple GPU (MPS) has no collective backend: one device per machine'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.strategies import ddp, deepspeed, fsdp, model_parallel, single
from lightning_anyaccel.strategies.base import Registered
from lightning_anyaccel.strategies.multi_process import AnyDistributedMixin
from lightning_anyaccel.strategies.support import deepspeed_support, has_collectives


@dataclass(frozen=True)
class Family:
    """One strategy family.

    Args:
        name: the family's module in :mod:`lightning_anyaccel.strategies`.
        trainer: its Trainer class.
        fabric: its Fabric class (its ``__name__`` is its public name in :mod:`lightning_anyaccel.fabric`).
        names: the names it registers with each front end, each with its description, arguments and the
            Lightning names it replaces; the first is the family's own (named in refusals).
        program_rebuild: whether an instance of exactly the family's Lightning class that a program builds itself
            is rebuilt as the family's strategy under ``LIGHTNING_ANYACCEL_ACTIVATE=1``.
        feature: the family's column in the support grid (a validation record's feature), ``""`` where it has none.
        words: besides :attr:`name`, the words vendor plugins join to a device type to name this family
            (lightning-habana's ``hpu_parallel``; :data:`FAMILY_WORDS`).
    """

    name: str
    trainer: type
    fabric: type
    names: Mapping[str, Registered]
    program_rebuild: bool = True
    feature: str = ""
    words: tuple[str, ...] = ()

    @property
    def own_name(self) -> str:
        """The family's first registered name (``any_ddp``)."""
        return next(iter(self.names))

    @property
    def lightning_class(self) -> str:
        """The name of Lightning's strategy class the family's Trainer class extends (``DDPStrategy``)."""
        return next(cls.__name__ for cls in self.trainer.__mro__ if cls.__module__.startswith("lightning.pytorch."))

    @property
    def multi_process(self) -> bool:
        """Whether the family starts several processes (its Trainer class is an ``AnyDistributedMixin``)."""
        return issubclass(self.trainer, AnyDistributedMixin)

    def register(self, cls: type, strategy_registry: Any) -> None:
        """Register :attr:`names` for ``cls`` (the family's class for one front end) in that front end's registry."""
        for name, entry in self.names.items():
            strategy_registry.register(name, cls, description=entry.description, override=True, **entry.arguments)


#: Every strategy family, in registration order.
FAMILIES: tuple[Family, ...] = (
    # a program's own SingleDeviceStrategy names its device: refused where that is not the accelerator's, never rebuilt
    Family("single", single.AnySingleDeviceStrategy, single.FabricSingleDeviceStrategy, single.NAMES,
           program_rebuild=False),
    # lightning-habana's HPUParallelStrategy ("hpu_parallel") is its DDP; lightning-teco registers its DDP as "dpp_sdaa"
    Family("ddp", ddp.AnyDDPStrategy, ddp.FabricDDPStrategy, ddp.NAMES, feature="ddp", words=("parallel", "dpp")),
    Family("fsdp", fsdp.AnyFSDPStrategy, fsdp.FabricFSDPStrategy, fsdp.NAMES, feature="fsdp"),
    Family("model_parallel", model_parallel.AnyModelParallelStrategy, model_parallel.FabricModelParallelStrategy,
           model_parallel.NAMES, feature="fsdp2"),
    Family("deepspeed", deepspeed.AnyDeepSpeedStrategy, deepspeed.FabricDeepSpeedStrategy, deepspeed.NAMES,
           feature="deepspeed"),
)


#: Lightning's registered strategy name -> the package's that replaces it (``"ddp"`` -> ``"any_ddp"``).
EQUIVALENTS: dict[str, str] = {
    lightning: name for family in FAMILIES for name, entry in family.names.items() for lightning in entry.replaces(name)
}
#: Lightning's strategy class -> the family's own name (what a refusal suggests instead).
CLASS_EQUIVALENTS: dict[str, str] = {family.lightning_class: family.own_name for family in FAMILIES}
#: Lightning's strategy classes a program may build itself that are rebuilt as the package's (same arguments).
PROGRAM_STRATEGIES: dict[str, str] = {
    family.lightning_class: family.own_name for family in FAMILIES if family.program_rebuild
}
#: Each registered name that stands for a start method alone -> that start method (``"any_ddp_spawn"`` -> ``"spawn"``).
START_METHODS: dict[str, str] = {
    name: entry.arguments["start_method"]
    for family in FAMILIES for name, entry in family.names.items() if set(entry.arguments) == {"start_method"}
}

#: The families that start several processes (their Trainer class is an ``AnyDistributedMixin``).
MULTI_PROCESS_FAMILIES: tuple[str, ...] = tuple(family.name for family in FAMILIES if family.multi_process)
#: The support grid's strategy columns (a validation record's features) -> the family that trains them.
FEATURE_FAMILIES: dict[str, str] = {family.feature: family.name for family in FAMILIES if family.feature}


def refusal(family: str, spec: DeviceSpec) -> str | None:
    """Why the package refuses the strategy ``family`` on ``spec``'s device type, in a few words; ``None`` where it runs.

    ``family`` is a name of :data:`FAMILIES` (``"ddp"``, ``"fsdp"``, ``"model_parallel"``, ``"deepspeed"``,
    ``"single"``). A multi-process family is refused where the device has no collective backend
    (``check_collectives``), DeepSpeed also where DeepSpeed has no accelerator for the device
    (``check_deepspeed_support``).

    Raises:
        ValueError: an unknown family name.
    """
    row = next((row for row in FAMILIES if row.name == family), None)
    if row is None:
        raise ValueError(f"unknown strategy family {family!r}: one of {', '.join(f.name for f in FAMILIES)}")
    if row.multi_process and not has_collectives(spec):
        return f"{spec.name} has no collective backend: one device per machine"
    if issubclass(row.trainer, deepspeed.AnyDeepSpeedMixin):
        support = deepspeed_support(spec, probe=False)
        if not support.supported:
            return support.reason
    return None


#: A family's words (its name and :attr:`Family.words`) -> its own name: what a vendor plugin's strategy name joins to
#: a device type (``hpu_ddp``, ``single_sdaa``; :mod:`lightning_anyaccel.wiring.vendor_names`).
FAMILY_WORDS: dict[str, str] = {word: family.own_name for family in FAMILIES for word in (family.name, *family.words)}


def trainer_strategies() -> dict[str, type]:
    """The Trainer's strategy classes by name (what :mod:`lightning_anyaccel.strategies` publishes)."""
    return {family.trainer.__name__: family.trainer for family in FAMILIES}


def fabric_strategies() -> dict[str, type]:
    """Fabric's strategy classes by public name (what :mod:`lightning_anyaccel.fabric.strategies` publishes)."""
    return {family.fabric.__name__: family.fabric for family in FAMILIES}


__all__ = ["CLASS_EQUIVALENTS", "EQUIVALENTS", "FAMILIES", "FAMILY_WORDS", "FEATURE_FAMILIES", "MULTI_PROCESS_FAMILIES",
           "PROGRAM_STRATEGIES", "START_METHODS", "Family", "fabric_strategies", "refusal", "trainer_strategies"]
