"""Optimizers step the parameters the model trains, even where moving the model replaced them.

A move to some devices replaces a module's parameters (see :mod:`lightning_anyaccel.checkpoints.optimizer_params`);
an optimizer built before the move would step the old CPU tensors. The Trainer's and Fabric's
single-device and DDP strategies mix in the class of their front end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary
from typing_extensions import override

from lightning_anyaccel.checkpoints.optimizer_params import named_parameters, replaced_parameters, repoint_optimizer

if TYPE_CHECKING:  # each mixin is mixed in before the strategies of one front end
    from lightning.fabric.strategies import Strategy as _FabricBase
    from lightning.pytorch.strategies import Strategy as _TrainerBase
else:
    _TrainerBase = _FabricBase = object


class TrainerParameterMovesMixin(_TrainerBase):
    """Trainer: optimizers step the parameters the model trains, even where moving it replaced them.

    An optimizer the user built before ``fit`` (in ``__init__``, returned by ``configure_optimizers``)
    holds the CPU parameters a replacing move left behind (see :mod:`lightning_anyaccel.checkpoints.optimizer_params`).
    Mixed in before the package's single-device and DDP strategies.
    """

    model: Any
    root_device: torch.device
    optimizers: list[Any]

    @override
    def model_to_device(self) -> None:
        before = named_parameters(self.model) if self.model is not None else {}
        super().model_to_device()  # type: ignore[safe-super]  # abstract in Strategy; the base after the mixin has it
        _parameter_moves(self).update(replaced_parameters(before, self.model) if before else {})

    @override
    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)
        module = self.lightning_module
        for optimizer in self.optimizers:
            repoint_optimizer(optimizer, _parameter_moves(self), self.root_device,
                              current=module.parameters() if module is not None else (),
                              fix="build the optimizer in configure_optimizers() from self.parameters(), not before fit")


class FabricParameterMovesMixin(_FabricBase):
    """Fabric: ``fabric.setup(model, optimizer)`` re-points the optimizer at the parameters the model trains.

    Where moving the model replaced its parameters, the optimizer built before ``setup`` is
    re-pointed, state included (Lightning does this for XLA only); an optimizer holding parameters
    no move explains is refused, naming the fix. Mixed in before the package's single-device and
    DDP strategies.
    """

    root_device: torch.device

    @override
    def module_to_device(self, module: torch.nn.Module) -> None:
        before = named_parameters(module)
        super().module_to_device(module)  # type: ignore[safe-super]  # abstract in Strategy; the base after the mixin has it
        _parameter_moves(self).update(replaced_parameters(before, module))
        _set_up_parameters(self).update((id(p), p) for p in module.parameters())

    @override
    def setup_module(self, module: torch.nn.Module) -> Any:
        module = super().setup_module(module)
        _set_up_parameters(self).update((id(p), p) for p in module.parameters())
        return module

    @override
    def setup_optimizer(self, optimizer: Any) -> Any:
        repoint_optimizer(optimizer, _parameter_moves(self), self.root_device,
                          current=_set_up_parameters(self).values(),
                          fix="call fabric.setup_module(model) first, build the optimizer from the returned"
                              " module's parameters, then fabric.setup_optimizers(optimizer)")
        return super().setup_optimizer(optimizer)


def _parameter_moves(strategy: Any) -> WeakIdKeyDictionary:
    """Old parameter -> moved parameter, for every move this strategy made (old ones are not kept alive)."""
    moves = getattr(strategy, "_parameter_moves", None)
    if moves is None:
        moves = strategy._parameter_moves = WeakIdKeyDictionary()
    return moves


def _set_up_parameters(strategy: Any) -> dict[int, torch.Tensor]:
    """The parameters of every module this (Fabric) strategy set up, by id."""
    known = getattr(strategy, "_set_up_parameters", None)
    if known is None:
        known = strategy._set_up_parameters = {}
    return known


__all__ = ["FabricParameterMovesMixin", "TrainerParameterMovesMixin"]
