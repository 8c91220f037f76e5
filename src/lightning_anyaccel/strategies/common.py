"""Former home of the behaviour shared by every strategy; its names stay importable from here.

The strategies now live one family per module (:mod:`~lightning_anyaccel.strategies.single`,
``.ddp``, ``.fsdp``, ``.model_parallel``, ``.deepspeed``) on the bases of
:mod:`~lightning_anyaccel.strategies.base` (every strategy) and
:mod:`~lightning_anyaccel.strategies.multi_process` (several processes); docs/architecture.md
has the map.

Example:
    >>> from lightning_anyaccel.strategies import AnyDDPStrategy as TrainerDDP
    >>> from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDP
    >>> issubclass(TrainerDDP, AnyDistributedMixin) and issubclass(FabricDDP, AnyDistributedMixin)
    True
"""

from __future__ import annotations

from lightning_anyaccel.strategies.base import AnyStrategyMixin
from lightning_anyaccel.strategies.errors import NotebookLaunchError
from lightning_anyaccel.strategies.multi_process import LAUNCHER_PID_ENV, START_METHODS, AnyDistributedMixin
from lightning_anyaccel.strategies.parameter_moves import FabricParameterMovesMixin, TrainerParameterMovesMixin
from lightning_anyaccel.strategies.process_launchers import SafeLaunchMixin
from lightning_anyaccel.strategies.single import LazyDeviceMixin

__all__ = [
    "LAUNCHER_PID_ENV",
    "START_METHODS",
    "AnyDistributedMixin",
    "AnyStrategyMixin",
    "FabricParameterMovesMixin",
    "LazyDeviceMixin",
    "NotebookLaunchError",
    "SafeLaunchMixin",
    "TrainerParameterMovesMixin",
]
