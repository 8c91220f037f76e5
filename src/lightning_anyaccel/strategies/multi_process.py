"""What the package's multi-process strategies share, for the Trainer and for Fabric: :class:`AnyDistributedMixin`.

DDP (:mod:`~lightning_anyaccel.strategies.ddp`) and the sharded families
(:mod:`~lightning_anyaccel.strategies.sharded`) build on it: the devices of the local ranks, the
collective backend from the device table, the launcher (Lightning's for ``popen``, the fork-checked
one otherwise; :class:`~lightning_anyaccel.cluster.environments.AnyMPIEnvironment` under ``mpiexec``), DDP
wrapping on the current stream, a barrier on every backend and the report of a failed collective.
Its setup steps are in :mod:`~lightning_anyaccel.strategies.steps`; each family lists them in its ``SETUP``.
The start method of each registered DDP name is the family table's
(:data:`~lightning_anyaccel.strategies.families.START_METHODS`).

Example:
    >>> LAUNCHER_PID_ENV.startswith("LIGHTNING_ANYACCEL_")
    True
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning.stubs import DistributedHooks
from lightning_anyaccel.accelerator import DeviceCountError, process_devices
from lightning_anyaccel.cluster import rendezvous, supervision, watchdog
from lightning_anyaccel.cluster.environments import (
    AnyMPIEnvironment,
    check_process_count,
    prefers_launcher,
    warn_ignored_variables,
)
from lightning_anyaccel.device.distributed import reduce_mean_as_sum, resolve_backend
from lightning_anyaccel.device.sync_batchnorm import DeviceLayerSync
from lightning_anyaccel.strategies.base import AnyStrategyMixin
from lightning_anyaccel.strategies.process_launchers import launcher_class

if TYPE_CHECKING:
    _Base = DistributedHooks
else:
    _Base = object

log = logging.getLogger(__name__)

#: Set by a launching process for the workers it starts, so they can exit when it dies.
LAUNCHER_PID_ENV = supervision.LAUNCHER_PID_ENV

class AnyDistributedMixin(AnyStrategyMixin, _Base):
    """Several processes: launcher, MPI adoption, backend, DDP wrapping, barrier, failure report.

    What every multi-process strategy (DDP, FSDP, FSDP2, DeepSpeed; Trainer and Fabric) has in
    common besides its setup steps (those are in its family's ``SETUP``).
    """

    cluster_environment: Any
    num_nodes: int
    num_processes: int
    node_rank: int
    local_rank: int
    global_rank: int
    world_size: int
    strategy_name: ClassVar[str] = "any_ddp"
    #: The collective backend the setup step ``prepare_backend`` resolved (``None`` before it ran).
    resolved_backend: str | None = None

    def __init__(self, *args: Any, timeout: timedelta | None = None, stall_timeout: float | None = None,
                 **kwargs: Any) -> None:
        """``timeout=None`` means :func:`~lightning_anyaccel.cluster.rendezvous.default_timeout` (10 min, or
        ``$LIGHTNING_ANYACCEL_TIMEOUT`` seconds). ``stall_timeout``: seconds without a step or a collective
        before the stall watchdog reports every rank's stack and ends the job (``0``: off; ``None``:
        :func:`~lightning_anyaccel.cluster.watchdog.stall_timeout`, 30 min or ``$LIGHTNING_ANYACCEL_STALL_TIMEOUT``)."""
        super().__init__(*args, timeout=timeout or rendezvous.default_timeout(), **kwargs)
        #: The stall watchdog's bound given to the strategy (``None``: the environment's or the default).
        self.stall_timeout = stall_timeout

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The device of each local rank (Lightning's attribute; the connector sets it from the accelerator)."""
        devices: list[torch.device] | None = _lightning.parallel_devices_of(self)
        return devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        """Number unnumbered devices by local rank (``[torch.device("hpu")] * 8``, lightning-habana's form).

        Lightning's DDP would fail at the first step ("Please use a device_id with index"); the
        numbering follows the device table (:func:`~lightning_anyaccel.accelerator.process_devices`).

        Raises:
            DeviceCountError: a count instead of a list, or a list numbered in part (naming the form to use).
        """
        if isinstance(devices, int):  # HPUDeepSpeedStrategy(parallel_devices=8), in lightning-habana's docs
            raise DeviceCountError(
                f"parallel_devices={devices!r} is a count: pass devices={devices} to the Trainer or Fabric and leave"
                " parallel_devices unset, or give a list of devices, e.g."
                f" parallel_devices=[torch.device('hpu')] * {devices}."
            )
        _lightning.set_parallel_devices(self, process_devices(list(devices)) if devices else devices)

    @property
    def process_group_backend(self) -> str | None:
        """The collective backend: the one given, else the device table's as soon as the device type is known.

        Lightning's strategies say ``None`` until ``setup``; vendor plugins (lightning-habana) report
        their backend right after construction. ``None`` while neither devices nor accelerator are known.
        """
        given = _lightning.process_group_backend_given(self)
        if given or self.resolved_backend:
            return given or self.resolved_backend
        device_type = self.parallel_devices[0].type if self.parallel_devices else getattr(
            self.accelerator, "device_type", None)
        return resolve_backend(torch.device(device_type)) if device_type else None

    @property
    def _layer_sync(self) -> Any:
        """Lightning's layer-sync plugin (``sync_batchnorm=True``), made to run on the device.

        The Trainer sets Lightning's ``TorchSyncBatchNorm`` here; it is wrapped in
        :class:`~lightning_anyaccel.device.sync_batchnorm.DeviceLayerSync`, which converts to torch's
        ``SyncBatchNorm`` only where the device has its kernels (CUDA; not CPU or most other
        devices) and to the package's all-reduce ``DeviceSyncBatchNorm`` elsewhere. Any other
        plugin is kept as given.
        """
        return self.__dict__.get("_any_layer_sync")

    @_layer_sync.setter
    def _layer_sync(self, plugin: Any) -> None:
        if type(plugin).__name__ == "TorchSyncBatchNorm":
            plugin = DeviceLayerSync(plugin, lambda: self.root_device)
        self.__dict__["_any_layer_sync"] = plugin

    @property
    def timeout(self) -> timedelta:
        """How long any rank waits for the others (rendezvous and every collective)."""
        timeout: timedelta | None = _lightning.timeout_of(self)
        assert timeout is not None
        return timeout

    @override
    def _get_process_group_backend(self) -> str:
        """Lightning's hook for the backend: the device table's choice, never ``fake`` or a silent ``gloo``.

        The one the setup step ``prepare_backend`` resolved; resolved here only when no setup ran.
        """
        return self.resolved_backend or resolve_backend(self.root_device, _lightning.process_group_backend_given(self))

    @override
    def _configure_launcher(self) -> None:
        """Adopt an MPI launcher's layout, then Lightning's launcher for popen, the fork-checked one otherwise."""
        self._adopt_launcher_environment()
        start_method = _lightning.start_method_of(self)
        if start_method == "popen":
            super()._configure_launcher()
        else:
            _lightning.set_launcher(self, launcher_class(self.side)(self, start_method=start_method))
        if not self.cluster_environment.creates_processes_externally:  # this process starts the workers
            supervision.prepare_launch()
        if self.parallel_devices:
            self._validate_device_setup()

    def _adopt_launcher_environment(self) -> None:
        """Use :class:`AnyMPIEnvironment` under an MPI launcher, and check the layout early.

        Lightning picks its generic environment (or ``MPIEnvironment``, which needs ``mpi4py``
        and derives nodes from host names, or Slurm's from the batch step that ran ``mpiexec``)
        for ``mpiexec`` jobs; each rank would then start its own workers, or every rank be rank 0
        (:func:`~lightning_anyaccel.cluster.environments.prefers_launcher`; variables it overrules are
        named in a warning, :func:`~lightning_anyaccel.cluster.environments.warn_ignored_variables`). Then an external
        launcher's process count must be ``devices x num_nodes``
        (:func:`~lightning_anyaccel.cluster.environments.check_process_count`). Runs in the
        launching process and in every externally launched rank, before any worker or connection:
        the one place every multi-process strategy of both front ends passes.
        """
        env = self.cluster_environment
        if prefers_launcher(env):
            env = self.cluster_environment = self.side.port(AnyMPIEnvironment)()
            self.side.set_world_ranks(self)
        warn_ignored_variables(env)
        check_process_count(env, devices=self.num_processes, num_nodes=self.num_nodes,
                            front_end=self.side.name.capitalize())
        if type(env) is self.side.port(LightningEnvironment):
            world_size = os.environ.get("WORLD_SIZE")
            rendezvous.check_layout(
                num_nodes=self.num_nodes,
                num_processes=self.num_processes,
                node_rank=env.node_rank(),
                local_rank=env.local_rank(),
                world_size=int(world_size) if world_size else None,
            )

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Say which rank failed and why the others stop, for errors of the process group (Trainer hook)."""
        super().on_exception(exception)
        if self.world_size > 1 and _is_distributed_failure(exception):
            log.error(
                "[lightning_anyaccel] rank %d/%d: a collective failed (%s). Another process of this job died,"
                " froze or lost its connection (timeout %s); the job stops on every rank.",
                self.global_rank, self.world_size, type(exception).__name__, self.timeout,
            )

    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Trainer: Lightning's reduction, a mean as a sum divided by the group's size (no ``ReduceOp.AVG``).

        What ``self.log(..., sync_dist=True)`` and ``strategy.reduce`` call; see
        :func:`~lightning_anyaccel.device.distributed.reduce_mean_as_sum`.
        """
        result = reduce_mean_as_sum(super().reduce, tensor, group, reduce_op)
        watchdog.progress()
        return result

    @override
    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Fabric: Lightning's ``all_reduce``, a mean as a sum divided by the group's size (no ``ReduceOp.AVG``)."""
        result = reduce_mean_as_sum(super().all_reduce, tensor, group, reduce_op)
        watchdog.progress()
        return result

    @override
    def teardown(self) -> None:
        """Lightning's teardown; the stall watchdog stops watching until the next setup (the process may idle now)."""
        watchdog.disarm()
        super().teardown()

    def _wrap_ddp(self, module: torch.nn.Module, device_ids: list[int] | None) -> Any:
        """Wrap ``module`` in DDP on the current stream, as plain PyTorch does, on every device type.

        Lightning 2.6 builds DDP inside a new ``torch.cuda.Stream`` where device ids are set: that
        fails on non-CUDA builds (Lightning-AI/pytorch-lightning#19766), and on CUDA makes every
        backward warn that the AccumulateGrad node's stream does not match
        (Lightning-AI/pytorch-lightning#21567, removed upstream by #21746;
        ``tests/test_sharding_cpu.py`` checks a DDP run's log has no such warning).
        """
        return DistributedDataParallel(module=module, device_ids=device_ids, **_lightning.ddp_kwargs(self))

    def _barrier(self) -> None:
        """A barrier on the device the process group was bound to (no NCCL-only ``device_ids``)."""
        if _lightning.distributed_is_initialized():
            torch.distributed.barrier()
            watchdog.progress()

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        """Synchronise all processes, on any backend (see :meth:`_barrier`)."""
        self._barrier()


def _is_distributed_failure(exception: BaseException) -> bool:
    """Whether ``exception`` came from the process group (a peer died, froze or disconnected)."""
    if isinstance(exception, torch.distributed.DistError):
        return True
    text = str(exception)
    return isinstance(exception, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset", "Timed out", "timed out")
    )


__all__ = ["LAUNCHER_PID_ENV", "AnyDistributedMixin"]
