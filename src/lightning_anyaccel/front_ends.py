"""The front-end adapter: every difference between the Trainer and Fabric that the strategies meet.

Lightning has two front ends (the Trainer, ``lightning.pytorch``; Fabric, ``lightning.fabric``)
published in two packages (``lightning``; ``pytorch_lightning`` + ``lightning_fabric``, see
:class:`lightning_anyaccel._lightning.Distribution`). The package's strategies are written once per
strategy family (:mod:`lightning_anyaccel.strategies`); where the two front ends name or do
something differently, the strategies ask their :class:`FrontEnd`, never a string naming a
Lightning attribute:

- where the precision plugin lives (Trainer: ``precision_plugin``; Fabric: ``precision``);
- how the ranks are set from the cluster environment (``set_world_ranks``/``_set_world_ranks``);
- where the extra ``FullyShardedDataParallel`` arguments live (``kwargs``/``_fsdp_kwargs``);
- the front end's ``FSDPPrecision`` and the package's replacement for it;
- the front end's ``DeepSpeedStrategy`` (whose own ``setup_environment`` is skipped).

A strategy class names its side with ``_side`` (:class:`TrainerSide` or :class:`FabricSide`);
:attr:`FrontEnd.package` is the Lightning package it was built on (``lightning`` unless
:func:`~lightning_anyaccel._lightning.port` rebuilt it for ``pytorch_lightning``).

Example:
    >>> from lightning_anyaccel._lightning import PYTORCH_LIGHTNING
    >>> FabricSide(PYTORCH_LIGHTNING).deepspeed_strategy_class().__module__
    'lightning_fabric.strategies.deepspeed'
    >>> TrainerSide().name, FabricSide().name
    ('trainer', 'fabric')
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning import LIGHTNING, Distribution, port

T = TypeVar("T")


@dataclass(frozen=True)
class FrontEnd(ABC):
    """How one front end (Trainer or Fabric) of one Lightning package names what the strategies use.

    Args:
        package: the Lightning package the strategy class is built on.
    """

    package: Distribution = LIGHTNING
    #: ``"trainer"`` or ``"fabric"`` (for messages and the docs).
    name: ClassVar[str]

    @abstractmethod
    def precision_plugin(self, strategy: Any) -> Any:
        """The strategy's precision plugin (Lightning's default when none was given)."""

    @abstractmethod
    def set_precision_plugin(self, strategy: Any, plugin: Any) -> None:
        """Replace the strategy's precision plugin."""

    @abstractmethod
    def given_precision_plugin(self, strategy: Any) -> Any:
        """The precision plugin the user or the connector gave, ``None`` if none (not Lightning's default)."""

    @abstractmethod
    def set_world_ranks(self, strategy: Any) -> None:
        """Set global rank and world size from the strategy's cluster environment."""

    @abstractmethod
    def fsdp_options(self, strategy: Any) -> dict[str, Any]:
        """The extra ``FullyShardedDataParallel`` arguments an FSDP strategy keeps (a dict it owns)."""

    @abstractmethod
    def fsdp_precision_classes(self) -> tuple[type[Any], type[Any]]:
        """The front end's ``FSDPPrecision`` (autocasts on ``"cuda"``) and the package's replacement for it."""

    @abstractmethod
    def deepspeed_strategy_class(self) -> type:
        """The front end's ``DeepSpeedStrategy`` (its ``setup_environment`` refuses every accelerator but CUDA)."""

    def port(self, obj: T) -> T:
        """``obj`` (a class of ``lightning`` or of the package) for :attr:`package`."""
        return port(obj, self.package)


@dataclass(frozen=True)
class TrainerSide(FrontEnd):
    """The Trainer (``lightning.pytorch`` or ``pytorch_lightning``)."""

    name: ClassVar[str] = "trainer"

    @override
    def precision_plugin(self, strategy: Any) -> Any:
        return strategy.precision_plugin

    @override
    def set_precision_plugin(self, strategy: Any, plugin: Any) -> None:
        strategy.precision_plugin = plugin

    @override
    def given_precision_plugin(self, strategy: Any) -> Any:
        return _lightning.trainer_given_precision(strategy)

    @override
    def set_world_ranks(self, strategy: Any) -> None:
        strategy.set_world_ranks()

    @override
    def fsdp_options(self, strategy: Any) -> dict[str, Any]:
        options: dict[str, Any] = strategy.kwargs
        return options

    @override
    def fsdp_precision_classes(self) -> tuple[type[Any], type[Any]]:
        from lightning.pytorch.plugins.precision import FSDPPrecision

        from lightning_anyaccel.device.sharded_precision import AnyFSDPPrecision

        return self.port(FSDPPrecision), self.port(AnyFSDPPrecision)

    @override
    def deepspeed_strategy_class(self) -> type:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return self.port(DeepSpeedStrategy)


@dataclass(frozen=True)
class FabricSide(FrontEnd):
    """Fabric (``lightning.fabric`` or ``lightning_fabric``)."""

    name: ClassVar[str] = "fabric"

    @override
    def precision_plugin(self, strategy: Any) -> Any:
        return strategy.precision

    @override
    def set_precision_plugin(self, strategy: Any, plugin: Any) -> None:
        strategy.precision = plugin

    @override
    def given_precision_plugin(self, strategy: Any) -> Any:
        return _lightning.fabric_given_precision(strategy)

    @override
    def set_world_ranks(self, strategy: Any) -> None:
        _lightning.fabric_set_world_ranks(strategy)

    @override
    def fsdp_options(self, strategy: Any) -> dict[str, Any]:
        return _lightning.fabric_fsdp_kwargs(strategy)

    @override
    def fsdp_precision_classes(self) -> tuple[type[Any], type[Any]]:
        from lightning.fabric.plugins.precision.fsdp import FSDPPrecision

        from lightning_anyaccel.device.sharded_precision import AnyFabricFSDPPrecision

        return self.port(FSDPPrecision), self.port(AnyFabricFSDPPrecision)

    @override
    def deepspeed_strategy_class(self) -> type:
        from lightning.fabric.strategies import DeepSpeedStrategy

        return self.port(DeepSpeedStrategy)


__all__ = ["FabricSide", "FrontEnd", "TrainerSide"]
