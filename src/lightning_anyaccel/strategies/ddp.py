"""``AnyDDPStrategy``: DistributedDataParallel on any device type (Trainer).

Lightning's ``DDPStrategy`` picks the backend from torch's default map (``fake`` for HPU, ``gloo``
for unregistered PrivateUse1 devices), wraps DDP in a ``torch.cuda.Stream`` (which fails on
non-CUDA builds), registers comm hooks only on CUDA, passes barrier ``device_ids`` only for
NCCL and checks only CUDA before forking. This subclass fixes each through
:mod:`lightning_anyaccel.strategies.common` (shared with Fabric's strategy) and the device table.

Registered names (after ``import lightning_anyaccel``): ``any_ddp`` (popen, scripts),
``any_ddp_spawn``, ``any_ddp_fork`` and ``any_ddp_notebook`` (fork, for Jupyter), each also with
``_find_unused_parameters_true``. With the package's accelerator, Lightning's names (``"ddp"``,
``"ddp_spawn"``, ...) and ``strategy="auto"`` with several devices select it too
(:mod:`lightning_anyaccel.policy`).

For multi-node jobs it also refuses inconsistent layouts before connecting, switches to
:class:`~lightning_anyaccel.environments.AnyMPIEnvironment` under ``mpiexec``, names gloo's
network interface, bounds every wait by ``timeout`` (default 10 min, see
:mod:`lightning_anyaccel.rendezvous`), and writes checkpoints atomically.
"""

from __future__ import annotations


from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.nn import Module
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.strategies.common import (
    LAUNCHER_PID_ENV,
    START_METHODS,
    AnyDistributedMixin,
    SafeLaunchMixin,
    TrainerParameterMovesMixin,
)


_MultiProcessingLauncher = _lightning.private(
    "lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher"
)


class AnyMultiProcessingLauncher(SafeLaunchMixin, _MultiProcessingLauncher):
    """Lightning's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`."""


class AnyDDPStrategy(TrainerParameterMovesMixin, AnyDistributedMixin, DDPStrategy):
    """DDP with the collective backend, streams and checks of the accelerator's device type.

    Takes every argument of Lightning's ``DDPStrategy``; ``process_group_backend=None`` (default)
    chooses the backend from the device table (xpu->xccl, cuda->nccl, hpu->hccl, cpu->gloo, vendor
    devices->the backend their vendor registered). ``start_method`` is ``"popen"`` (default;
    runs the script again per rank), ``"spawn"`` or ``"fork"`` (notebooks). The setup sequence and
    the multi-node protections are :class:`~lightning_anyaccel.strategies.common.AnyDistributedMixin`'s.
    """

    strategy_name = "any_ddp"
    _launcher_class = AnyMultiProcessingLauncher

    @override
    def _setup_model(self, model: Module) -> Any:
        device_ids = self.determine_ddp_device_ids()
        return self._wrap_ddp(model, device_ids)

    @override
    def _register_ddp_hooks(self) -> None:
        """Register DDP comm hooks on every device type (Lightning does it on CUDA only)."""
        _lightning.private("lightning.pytorch.overrides.distributed", "_register_ddp_comm_hook")(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
            ddp_comm_hook=self._ddp_comm_hook,
        )


__all__ = ["LAUNCHER_PID_ENV", "AnyDDPStrategy", "AnyMultiProcessingLauncher", "START_METHODS"]
