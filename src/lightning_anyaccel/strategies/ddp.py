"""``AnyDDPStrategy``: DistributedDataParallel on any device type (Trainer).

Lightning's ``DDPStrategy`` picks the backend from torch's default map (``fake`` for HPU, ``gloo``
for unregistered PrivateUse1 devices), wraps DDP in a ``torch.cuda.Stream`` (which fails on
non-CUDA builds), registers comm hooks only on CUDA, passes barrier ``device_ids`` only for
NCCL and checks only CUDA before forking. This subclass fixes each through
:mod:`lightning_anyaccel.strategies.common` (shared with Fabric's strategy) and the device table.

Registered names (after ``import lightning_anyaccel``): ``any_ddp`` (popen, scripts),
``any_ddp_spawn``, ``any_ddp_fork`` and ``any_ddp_notebook`` (fork, for Jupyter).

For multi-node jobs it also refuses inconsistent layouts before connecting, switches to
:class:`~lightning_anyaccel.environments.AnyMPIEnvironment` under ``mpiexec``, names gloo's
network interface, bounds every wait by ``timeout`` (default 10 min, see
:mod:`lightning_anyaccel.rendezvous`), and writes checkpoints atomically.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from lightning.fabric.plugins.environments import LightningEnvironment, MPIEnvironment
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from torch.nn import Module
from typing_extensions import override

from lightning_anyaccel import rendezvous, supervision
from lightning_anyaccel.environments import AnyMPIEnvironment
from lightning_anyaccel.strategies.common import START_METHODS, AnyDistributedMixin, SafeLaunchMixin

log = logging.getLogger(__name__)

#: Set by a launching process for the workers it starts, so they can exit when it dies.
LAUNCHER_PID_ENV = supervision.LAUNCHER_PID_ENV


class AnyMultiProcessingLauncher(SafeLaunchMixin, _MultiProcessingLauncher):
    """Lightning's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`."""


class AnyDDPStrategy(AnyDistributedMixin, DDPStrategy):
    """DDP with the collective backend, streams and checks of the accelerator's device type.

    Takes every argument of Lightning's ``DDPStrategy``; ``process_group_backend=None`` (default)
    chooses the backend from the device table (xpu->xccl, cuda->nccl, hpu->hccl, cpu->gloo, vendor
    devices->the backend their vendor registered). ``start_method`` is ``"popen"`` (default;
    runs the script again per rank), ``"spawn"`` or ``"fork"`` (notebooks).
    """

    strategy_name = "any_ddp"
    _launcher_class = AnyMultiProcessingLauncher

    @override
    def _configure_launcher(self) -> None:
        self._adopt_launcher_environment()
        super()._configure_launcher()

    def _adopt_launcher_environment(self) -> None:
        """Use :class:`AnyMPIEnvironment` under an MPI launcher, and check the layout early.

        Lightning picks its generic environment (or ``MPIEnvironment``, which needs ``mpi4py``
        and derives nodes from host names) for ``mpiexec`` jobs; each rank would then start
        its own workers. Runs in the launching process, before any worker or connection.
        """
        env = self.cluster_environment
        if type(env) in (LightningEnvironment, MPIEnvironment) and AnyMPIEnvironment.detect():
            self.cluster_environment = AnyMPIEnvironment()
            self.set_world_ranks()
        elif type(env) is LightningEnvironment:
            world_size = os.environ.get("WORLD_SIZE")
            rendezvous.check_layout(
                num_nodes=self.num_nodes,
                num_processes=self.num_processes,
                node_rank=env.node_rank(),
                local_rank=env.local_rank(),
                world_size=int(world_size) if world_size else None,
            )

    @override
    def setup_environment(self) -> None:
        self._check_accelerator()
        self._align_precision()
        supervision.supervise_worker(self.global_rank)  # [faults] a worker dies with its launching process
        super().setup_environment()

    @override
    def setup_distributed(self) -> None:
        """Check the layout, name gloo's interface, then join the group within ``timeout``."""
        env = self.cluster_environment
        assert env is not None
        self.set_world_ranks()
        rendezvous.check_layout(
            num_nodes=self.num_nodes,
            num_processes=self.num_processes,
            node_rank=self.node_rank,
            local_rank=self.local_rank,
            world_size=env.world_size(),
            global_rank=env.global_rank(),
        )
        address, port = env.main_address, env.main_port
        rendezvous.configure_socket_interface(address)
        seconds = self.timeout.total_seconds() + rendezvous.RENDEZVOUS_GRACE_S
        message = (
            f"rank {env.global_rank()}/{env.world_size()}: the rendezvous at {address}:{port} did not complete."
            f" Check that all {self.num_nodes} node(s) started with the same MASTER_ADDR/MASTER_PORT and distinct"
            " NODE_RANKs, that the port is not used by another program, and that no firewall blocks it"
        )
        with rendezvous.Deadline(seconds, message):
            super().setup_distributed()
        self._destroy_at_exit()

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Say which rank failed and why the others stop, for errors of the process group."""
        super().on_exception(exception)
        if self.world_size > 1 and _is_distributed_failure(exception):
            log.error(
                "[lightning_anyaccel] rank %d/%d: a collective failed (%s). Another process of this job died,"
                " froze or lost its connection (timeout %s); the job stops on every rank.",
                self.global_rank, self.world_size, type(exception).__name__, self.timeout,
            )

    @override
    def _setup_model(self, model: Module) -> Any:
        device_ids = self.determine_ddp_device_ids()
        return self._wrap_ddp(model, device_ids, lambda: super(AnyDDPStrategy, self)._setup_model(model))

    @override
    def _register_ddp_hooks(self) -> None:
        """Register DDP comm hooks on every device type (Lightning does it on CUDA only)."""
        _register_ddp_comm_hook(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
            ddp_comm_hook=self._ddp_comm_hook,
        )


def _is_distributed_failure(exception: BaseException) -> bool:
    """Whether ``exception`` came from the process group (a peer died, froze or disconnected)."""
    if isinstance(exception, torch.distributed.DistError):
        return True
    text = str(exception)
    return isinstance(exception, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset", "Timed out", "timed out")
    )


__all__ = ["LAUNCHER_PID_ENV", "AnyDDPStrategy", "AnyMultiProcessingLauncher", "START_METHODS"]
