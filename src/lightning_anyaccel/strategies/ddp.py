"""The DDP family: DistributedDataParallel on any device type, for the Trainer and for Fabric.

Lightning's ``DDPStrategy`` picks the backend from torch's default map (``fake`` for HPU, ``gloo``
for unregistered PrivateUse1 devices), wraps DDP in a ``torch.cuda.Stream`` (which fails on
non-CUDA builds), registers comm hooks only on CUDA, passes barrier ``device_ids`` only for
NCCL and checks only CUDA before forking. The Trainer's :class:`AnyDDPStrategy` and Fabric's
(``lightning_anyaccel.fabric.AnyDDPStrategy``) fix each through
:class:`~lightning_anyaccel.strategies.multi_process.AnyDistributedMixin` and the device table.

Registered names (after ``import lightning_anyaccel``): ``any_ddp`` (popen, scripts),
``any_ddp_spawn``, ``any_ddp_fork`` and ``any_ddp_notebook`` (fork, for Jupyter), each also with
``_find_unused_parameters_true``. With the package's accelerator, Lightning's names (``"ddp"``,
``"ddp_spawn"``, ...) and ``strategy="auto"`` with several devices select it too
(:mod:`lightning_anyaccel.wiring.policy`).

For multi-node jobs it also refuses inconsistent layouts before connecting, switches to
:class:`~lightning_anyaccel.cluster.environments.AnyMPIEnvironment` under ``mpiexec``, names gloo's
network interface, bounds every wait by ``timeout`` (default 10 min, see
:mod:`lightning_anyaccel.cluster.rendezvous`), and writes checkpoints atomically.

Setup (:data:`SETUP`): the checks that need no device and no peer run in the launching process
and in every worker; then the layout, gloo's interface, Lightning's setup within the rendezvous
deadline, the device's precision check and the exit hook.

Example:
    >>> [step.name for step in SETUP if step.before_launch]  # doctest: +NORMALIZE_WHITESPACE
    ['supervise_worker', 'check_accelerator', 'align_precision', 'check_start_method', 'check_fork_safety',
     'prepare_backend']
"""

from __future__ import annotations

from typing import Any, ClassVar

from lightning.fabric.strategies import DDPStrategy as FabricDDP
from lightning.pytorch.strategies import DDPStrategy
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.front_ends import FabricSide
from lightning_anyaccel.strategies.base import FabricProgressMixin, Registered, fabric_class
from lightning_anyaccel.strategies.multi_process import AnyDistributedMixin
from lightning_anyaccel.strategies.parameter_moves import FabricParameterMovesMixin, TrainerParameterMovesMixin
from lightning_anyaccel.strategies.steps import (
    AFTER_JOIN,
    BEFORE_JOIN,
    Setup,
    in_worker,
    launch_checks,
    lightning_setup_within_deadline,
)

#: What a DDP strategy does at setup, in order (launching process: the ``before_launch`` steps).
SETUP: Setup = (
    *launch_checks(),
    *BEFORE_JOIN,
    in_worker(lightning_setup_within_deadline),
    *AFTER_JOIN,
)


#: The names the family registers with each front end, by start method, each also with
#: ``_find_unused_parameters_true`` (the start method a name stands for:
#: :data:`~lightning_anyaccel.strategies.families.START_METHODS`).
NAMES: dict[str, Registered] = {
    registered: Registered(
        f"DDP on the accelerator's device type, start method {start_method!r}{suffix}",
        {"start_method": start_method, **arguments},
        lightning,
    )
    for name, start_method in (("any_ddp", "popen"), ("any_ddp_spawn", "spawn"), ("any_ddp_fork", "fork"),
                               ("any_ddp_notebook", "fork"))
    for registered, suffix, arguments, lightning in (
        # Lightning's `ddp_find_unused_parameters_false` is its `ddp`
        (name, "", {}, (name[4:], f"{name[4:]}_find_unused_parameters_false")),
        (f"{name}_find_unused_parameters_true", ", find_unused_parameters=True", {"find_unused_parameters": True}, None),
    )
}


class AnyDDPMixin(AnyDistributedMixin):
    """DDP's setup and names, for either front end's ``DDPStrategy``."""

    strategy_name: ClassVar[str] = "any_ddp"
    setup_steps: ClassVar[Setup] = SETUP


class AnyDDPStrategy(TrainerParameterMovesMixin, AnyDDPMixin, DDPStrategy):
    """DDP with the collective backend, streams and checks of the accelerator's device type (Trainer).

    Takes every argument of Lightning's ``DDPStrategy``; ``process_group_backend=None`` (default)
    chooses the backend from the device table (xpu->xccl, cuda->nccl, hpu->hccl, cpu->gloo, vendor
    devices->the backend their vendor registered). ``start_method`` is ``"popen"`` (default;
    runs the script again per rank), ``"spawn"`` or ``"fork"`` (notebooks). The setup is :data:`SETUP`.
    """

    @override
    def _setup_model(self, model: Module) -> Any:
        device_ids = self.determine_ddp_device_ids()
        return self._wrap_ddp(model, device_ids)

    @override
    def _register_ddp_hooks(self) -> None:
        """Register DDP comm hooks on every device type (Lightning does it on CUDA only)."""
        _lightning.register_ddp_comm_hook(model=self.model, **_lightning.ddp_comm_settings(self))


@fabric_class("AnyDDPStrategy")
class FabricDDPStrategy(FabricProgressMixin, FabricParameterMovesMixin, AnyDDPMixin, FabricDDP):
    """Fabric DDP with the backend, streams, barrier and fork checks of the accelerator's device type.

    Published as ``lightning_anyaccel.fabric.AnyDDPStrategy``. Takes every argument of Lightning's
    Fabric ``DDPStrategy``; ``process_group_backend=None`` chooses from the device table,
    ``start_method`` is ``"popen"`` (default), ``"spawn"`` or ``"fork"``. The setup is :data:`SETUP`.
    """

    _side = FabricSide

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        device_ids = _lightning.fabric_ddp_device_ids(self)
        return self._wrap_ddp(module, device_ids)


__all__ = ["NAMES", "SETUP", "AnyDDPMixin", "AnyDDPStrategy", "FabricDDPStrategy"]
