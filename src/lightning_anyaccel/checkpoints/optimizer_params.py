"""Optimizers never step parameters a device move left behind.

``module.to(device)`` moves parameters in place where torch can shallow-copy the device's
tensors into them (``torch._has_compatible_shallow_copy_type``). Where it can not, as for some
out-of-tree PrivateUse1 backends (and XLA), torch *replaces* each parameter by a new one on the
device: an optimizer built before the move still holds the old CPU tensors, and training
steps them, silently, while the model on the device never changes. Lightning repairs this for
XLA only (``Fabric._move_model_to_device``).

The strategies record which parameters a move replaced (:func:`named_parameters` before,
:func:`replaced_parameters` after) and re-point every optimizer they set up at the moved
parameters, state included (:func:`repoint_optimizer`). A parameter on another device type
than the strategy's that no recorded move explains is refused with the fix
(:class:`StaleParametersError`): set the model up first, build the optimizer after.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> before = named_parameters(model)
    >>> model.weight = torch.nn.Parameter(model.weight.detach().clone())  # what a replacing move does
    >>> optimizer = torch.optim.SGD(before.values(), lr=0.1)
    >>> repoint_optimizer(optimizer, replaced_parameters(before, model), torch.device("cpu"))
    1
    >>> optimizer.param_groups[0]["params"][0] is model.weight
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim import Optimizer

from lightning_anyaccel.troubleshooting import LinkedError

#: The optimizer state entries that stay where the optimizer keeps them (``step`` counters live on CPU).
_STATE_KEPT_IN_PLACE = frozenset({"step"})


class StaleParametersError(LinkedError, RuntimeError):
    """An optimizer holds parameters the model no longer trains (they were replaced when it moved)."""


def named_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` of ``module``, shared parameters under each of their names."""
    return dict(module.named_parameters(remove_duplicate=False))


def replaced_parameters(before: Mapping[str, torch.Tensor], module: torch.nn.Module) -> dict[torch.Tensor, torch.Tensor]:
    """Old parameter -> new parameter, for each parameter of ``module`` a move replaced instead of moving in place."""
    after = named_parameters(module)
    return {old: after[name] for name, old in before.items() if name in after and after[name] is not old}


def repoint_optimizer(
    optimizer: Optimizer,
    replaced: Mapping[torch.Tensor, torch.Tensor],
    device: torch.device,
    current: Iterable[torch.Tensor] = (),
    fix: str = "set the model up first, then build the optimizer from its parameters",
) -> int:
    """Point ``optimizer``'s parameter groups and state at the moved parameters; return how many were re-pointed.

    State tensors (momentum, Adam's moments) move with their parameter to its device; ``step``
    stays where the optimizer keeps it.

    Raises:
        StaleParametersError: a parameter on another device type than ``device`` that is neither
            one of ``current`` (the set-up model's parameters) nor explained by a recorded move.
    """
    known = {id(p) for p in current}
    count = 0
    for group in optimizer.param_groups:
        params = []
        for param in group["params"]:
            new = replaced.get(param)
            if new is not None:
                _move_state(optimizer, param, new)
                params.append(new)
                count += 1
                continue
            if param.device.type != device.type and id(param) not in known:
                raise StaleParametersError(
                    f"The optimizer {type(optimizer).__name__} holds a parameter on {param.device}, but the model"
                    f" trains on {device}: the optimizer was built from parameters the model no longer has, and"
                    f" would train nothing. To fix: {fix}."
                )
            params.append(param)
        group["params"] = params
    return count


def _move_state(optimizer: Optimizer, old: torch.Tensor, new: torch.Tensor) -> None:
    state: Any = optimizer.state.pop(old, None)
    if state is None:
        return
    optimizer.state[new] = {
        key: value.to(new.device) if torch.is_tensor(value) and key not in _STATE_KEPT_IN_PLACE else value
        for key, value in state.items()
    }


__all__ = ["StaleParametersError", "named_parameters", "replaced_parameters", "repoint_optimizer"]
