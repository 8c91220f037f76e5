"""Lightning's spawn/fork launchers (Trainer's and Fabric's) with the package's fixes.

:class:`SafeLaunchMixin` is mixed in before Lightning's ``_MultiProcessingLauncher`` of either
front end; the distributed strategies take the one of their front end from :func:`launcher_class`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning.stubs import MultiProcessingLauncherHooks
from lightning_anyaccel.cluster import supervision
from lightning_anyaccel.device.devices import is_host
from lightning_anyaccel.device.distributed import check_fork_safe
from lightning_anyaccel.front_ends import FabricSide, FrontEnd
from lightning_anyaccel.strategies.base import fabric_class

if TYPE_CHECKING:
    _Base = MultiProcessingLauncherHooks
else:
    _Base = object


class SafeLaunchMixin(_Base):
    """Mixed in before Lightning's multiprocessing launcher (Trainer's or Fabric's).

    Two fixes over Lightning's launcher, which only knows its own CPU/CUDA accelerators:

    - refuse a ``fork`` when the strategy's device type was already initialised in the parent
      (Lightning only checks CUDA), right before the processes start;
    - under ``spawn`` on CPU, give every process its own copy of the model: torch moves tensors
      passed through ``spawn`` into shared memory, so without this all ranks would step the same
      weights (Lightning does it only for ``CPUAccelerator``, not for other accelerators on CPU).
    """

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        if _lightning.start_method_of(self) in ("fork", "forkserver"):
            check_fork_safe(_lightning.launcher_strategy(self).root_device.type)
        return super().launch(function, *args, **kwargs)

    @override
    def _wrapping_function(self, process_idx: int, *rest: Any) -> Any:
        strategy = _lightning.launcher_strategy(self)
        if _lightning.start_method_of(self) == "spawn" and is_host(strategy.root_device.type):
            rest = _lightning.disable_module_memory_sharing(rest)
        with supervision.report_failure(lambda: strategy.global_rank):  # name the failed rank
            return super()._wrapping_function(process_idx, *rest)


class AnyMultiProcessingLauncher(SafeLaunchMixin, _lightning.TrainerMultiProcessingLauncher):
    """The Trainer's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`."""


@fabric_class("AnyMultiProcessingLauncher")
class FabricMultiProcessingLauncher(SafeLaunchMixin, _lightning.FabricMultiProcessingLauncher):
    """Fabric's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`.

    Published as ``lightning_anyaccel.fabric.AnyMultiProcessingLauncher``.
    """


def launcher_class(side: FrontEnd) -> type:
    """The spawn/fork launcher with the package's fixes of ``side``'s front end, for its Lightning package."""
    return side.port(FabricMultiProcessingLauncher if isinstance(side, FabricSide) else AnyMultiProcessingLauncher)


__all__ = ["AnyMultiProcessingLauncher", "FabricMultiProcessingLauncher", "SafeLaunchMixin", "launcher_class"]
