"""Behaviour shared by every strategy of the package, for the Trainer and for Fabric.

The Trainer strategies (:mod:`lightning_anyaccel.strategies`) and the Fabric strategies
(:mod:`lightning_anyaccel.fabric`) differ only in what Lightning base class they extend and in
the name of a few Lightning attributes; everything that knows about devices (precision
alignment, backend choice, fork safety, notebook launches, DDP wrapping, barriers, the lazy
single device, atomic checkpoints, registration) lives here once; the sharded strategies' device
logic builds on it in :mod:`lightning_anyaccel.strategies.sharding`.

Every strategy, Trainer and Fabric, single-device, DDP and sharded, sets up in the same order,
written once in :meth:`AnyStrategyMixin.setup_environment`:

1. ``_check_setup``: what needs neither the device nor the other processes (accelerator and
   precision for the device type; with several processes also start method, backend, process
   layout, the watch on the launching process and gloo's network interface);
2. ``_lightning_setup``: Lightning's own ``setup_environment`` (select the device, join the
   process group), bounded by the rendezvous deadline when there are several processes;
3. ``_finish_setup``: what needs the device and the group (the device's own precision check; the
   exit hook that destroys the process group).

Mixins extend a step with ``super()``, never the order. The multi-node protections of
:mod:`lightning_anyaccel.rendezvous` (MPI launcher detection and layout checks before any
worker starts, in ``_configure_launcher``; the deadline; the interface; the parent watch) are in
:class:`AnyDistributedMixin`, so they apply to DDP, FSDP, FSDP2 and DeepSpeed alike.

Example (the same mixin under both front ends):
    >>> from lightning_anyaccel.strategies import AnyDDPStrategy as TrainerDDP
    >>> from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDP
    >>> issubclass(TrainerDDP, AnyDistributedMixin) and issubclass(FabricDDP, AnyDistributedMixin)
    True
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.multiprocessing as mp
from lightning.fabric.plugins.environments import LightningEnvironment, MPIEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.nn.parallel import DistributedDataParallel
from torch.utils.weak import WeakIdKeyDictionary
from typing_extensions import override

from lightning_anyaccel import _lightning, rendezvous, supervision
from lightning_anyaccel.accelerator import DeviceCountError, DeviceTypeError, process_devices
from lightning_anyaccel.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.compilation import check_compiled
from lightning_anyaccel.distributed import check_fork_safe, resolve_backend
from lightning_anyaccel.environments import AnyMPIEnvironment
from lightning_anyaccel.optimizer_params import named_parameters, replaced_parameters, repoint_optimizer
from lightning_anyaccel.precision import align_precision_plugin, check_device_supports
from lightning_anyaccel.troubleshooting import LinkedError
from lightning_anyaccel.sync_batchnorm import DeviceLayerSync

log = logging.getLogger(__name__)

#: Set by a launching process for the workers it starts, so they can exit when it dies.
LAUNCHER_PID_ENV = supervision.LAUNCHER_PID_ENV

#: Registered DDP name -> start method (the same names for the Trainer and for Fabric).
START_METHODS: dict[str, str] = {
    "any_ddp": "popen",
    "any_ddp_spawn": "spawn",
    "any_ddp_fork": "fork",
    "any_ddp_notebook": "fork",
}


class NotebookLaunchError(LinkedError, MisconfigurationException, RuntimeError):
    """A start method that can not work from a notebook / interactive session (or this platform)."""


class AnyStrategyMixin:
    """Device-generic overrides; mixed in before a Lightning strategy class.

    Relies on the Lightning strategy API only: ``root_device``, ``accelerator``,
    ``precision_plugin`` (``precision`` in Fabric: set ``_precision_attr``) and ``checkpoint_io``.
    """

    root_device: torch.device
    accelerator: Any
    #: Name of the Lightning attribute holding the precision plugin.
    _precision_attr: ClassVar[str] = "precision_plugin"
    #: The name the strategy registers under.
    strategy_name: ClassVar[str] = ""
    #: The Lightning package the class is built on (:func:`lightning_anyaccel._lightning.port` sets it).
    _front_end: ClassVar[_lightning.FrontEnd] = _lightning.LIGHTNING
    #: A Lightning strategy class (full name as in ``lightning``) whose own ``setup_environment`` is
    #: skipped in step 2 (DeepSpeed's refuses every accelerator but CUDA); ``None``: skip nothing.
    _lightning_setup_skips: ClassVar[str | None] = None

    # ----- the one setup sequence -----------------------------------------------------------------

    @override
    def setup_environment(self) -> None:
        """Set up the process: checks, then Lightning's setup, then the device's checks and exit hooks.

        The order is the same for every strategy of the package (see the module docstring);
        mixins extend the steps :meth:`_check_setup`, :meth:`_lightning_setup` and
        :meth:`_finish_setup`.
        """
        self._check_setup()
        self._lightning_setup()
        self._finish_setup()

    def _check_setup(self) -> None:
        """Step 1: what needs neither the device nor other processes."""
        self._validate_device_setup()

    def _lightning_setup(self) -> None:
        """Step 2: Lightning's own ``setup_environment`` (device selection; the process group)."""
        skipped = self._lightning_setup_skips
        start = _lightning.lightning_class(self, skipped) if skipped else AnyStrategyMixin
        super(start, self).setup_environment()  # type: ignore[misc]

    def _finish_setup(self) -> None:
        """Step 3: what needs the device (its own precision check)."""
        self._check_device_precision()

    def setup(self, trainer: Any) -> None:
        """The Trainer's model setup, after refusing compiled parts the device cannot compile (Trainer only).

        Runs after ``configure_model``, so a ``torch.compile`` there is checked too
        (:func:`lightning_anyaccel.compilation.check_compiled`; nothing is probed where Inductor
        compiles for the device).
        """
        module = getattr(self, "lightning_module", None)
        if module is not None:
            check_compiled(module, self.root_device)
        super().setup(trainer)  # type: ignore[misc]

    # ----- the steps' parts -----------------------------------------------------------------------

    @property
    def device_type(self) -> str:
        """The device type this strategy trains on (``self.root_device.type``)."""
        return self.root_device.type

    def _check_accelerator(self) -> None:
        """Refuse an accelerator of another device type than the strategy's devices (:class:`DeviceTypeError`)."""
        accelerator_type = getattr(self.accelerator, "device_type", None)
        if accelerator_type is not None and accelerator_type != self.device_type:
            raise DeviceTypeError(
                f"{type(self).__name__} runs on {self.root_device}, but the accelerator is {self.accelerator!r}."
                " Leave the strategy's devices unset: it takes them from the accelerator."
            )

    def _align_precision(self) -> None:
        """Rebuild a mixed-precision plugin made for another device type (Lightning picks ``cuda``)."""
        plugin = getattr(self, self._precision_attr)
        aligned = align_precision_plugin(plugin, self.device_type)
        if aligned is not plugin:
            setattr(self, self._precision_attr, aligned)

    def _check_device_precision(self) -> None:
        """Ask the device (in the worker process, after ``setup_device``) whether it can do the precision."""
        precision = getattr(getattr(self, self._precision_attr), "precision", "")
        check_device_supports(str(precision), self.root_device)

    @property
    def checkpoint_io(self) -> Any:
        """Lightning's checkpoint IO, defaulting to :class:`AtomicCheckpointIO` (a kill mid-save keeps the old file).

        Set lazily rather than in ``__init__``, so ``plugins=[MyCheckpointIO()]`` still works.
        """
        if self._checkpoint_io is None:
            self._checkpoint_io = _lightning.port(AtomicCheckpointIO, self._front_end)()
        return super().checkpoint_io  # type: ignore[misc]

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None:
        self._checkpoint_io = io

    def _validate_device_setup(self) -> None:
        """Everything that can be checked in the launching process, before any worker starts."""
        self._check_accelerator()
        self._align_precision()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register :attr:`strategy_name` (Trainer's or Fabric's registry: both have the same API)."""
        strategy_registry.register(
            cls.strategy_name, cls, description="One device of the accelerator's type", override=True
        )


class LazyDeviceMixin(AnyStrategyMixin):
    """One process, one device, taken from the accelerator unless given.

    Lightning's connectors (Trainer and Fabric) hand the selected device over through
    ``parallel_devices``; ``devices=[1]`` with an XPU accelerator gives ``xpu:1``. Mixed in before
    Lightning's ``SingleDeviceStrategy`` (either front end).

    Args:
        device: a device such as ``"xpu:1"`` (``"xpu"`` is ``"xpu:0"``); ``None`` (default) takes the
            device selected by the ``accelerator`` and ``devices`` arguments.
        **kwargs: the Lightning ``SingleDeviceStrategy`` arguments (accelerator, checkpoint_io, precision).
    """

    _root_device: torch.device | None

    def __init__(self, device: str | torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(device="cpu", **kwargs)  # type: ignore[call-arg]
        # an unnumbered device ("hpu", as lightning-habana's SingleHPUStrategy takes it) is the process's device 0
        self._root_device = process_devices([torch.device(device)])[0] if device is not None else None

    @property
    @override
    def root_device(self) -> torch.device:  # type: ignore[override]
        """The device given, else device 0 of the accelerator's type."""
        if self._root_device is None:
            device_type = getattr(self.accelerator, "device_type", None)
            if device_type is None:
                raise MisconfigurationException(
                    f"{type(self).__name__}() has no device yet: pass it with an accelerator,"
                    f" or give one, e.g. {type(self).__name__}('xpu:0')."
                )
            return torch.device(device_type, 0) if device_type != "cpu" else torch.device("cpu")
        return self._root_device

    @property
    def parallel_devices(self) -> list[torch.device]:
        """The one device, as a list: lets Lightning's connector hand over the selected device."""
        return [self._root_device] if self._root_device is not None else []

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        if len(devices) != 1:
            raise MisconfigurationException(
                f"strategy='{self.strategy_name}' trains on one device, but devices= selected {len(devices)}:"
                f" {devices}. Use devices=1, or strategy='any_ddp' for several devices."
            )
        self._root_device = devices[0]

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        self._validate_device_setup()


class AnyDistributedMixin(AnyStrategyMixin):
    """Several processes: launcher, multi-node protections, backend, process group, DDP wrapping, barrier.

    Extends the setup steps with what every multi-process strategy (DDP, FSDP, FSDP2, DeepSpeed;
    Trainer and Fabric) needs: the layout checks, the watch on the launching process and gloo's
    interface before connecting; the rendezvous deadline around Lightning's setup; the exit hook.
    """

    _process_group_backend: str | None
    _ddp_kwargs: dict[str, Any]
    _start_method: str
    _parallel_devices: list[torch.device] | None
    _launcher: Any
    cluster_environment: Any
    num_nodes: int
    num_processes: int
    node_rank: int
    local_rank: int
    global_rank: int
    world_size: int
    #: The front end's multiprocessing launcher class with :class:`SafeLaunchMixin` mixed in.
    _launcher_class: ClassVar[type]
    #: The front end's method that sets the ranks from the cluster environment.
    _set_world_ranks_attr: ClassVar[str] = "set_world_ranks"
    strategy_name: ClassVar[str] = "any_ddp"

    def __init__(self, *args: Any, timeout: timedelta | None = None, **kwargs: Any) -> None:
        """``timeout=None`` means :func:`~lightning_anyaccel.rendezvous.default_timeout` (10 min, or
        ``$LIGHTNING_ANYACCEL_TIMEOUT`` seconds)."""
        super().__init__(*args, timeout=timeout or rendezvous.default_timeout(), **kwargs)

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The device of each local rank (Lightning's attribute; the connector sets it from the accelerator)."""
        return self._parallel_devices

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
        self._parallel_devices = process_devices(list(devices)) if devices else devices

    @property
    def process_group_backend(self) -> str | None:
        """The collective backend: the one given, else the device table's as soon as the device type is known.

        Lightning's strategies say ``None`` until ``setup``; vendor plugins (lightning-habana) report
        their backend right after construction. ``None`` while neither devices nor accelerator are known.
        """
        if self._process_group_backend:
            return self._process_group_backend
        device_type = self.parallel_devices[0].type if self.parallel_devices else getattr(
            self.accelerator, "device_type", None)
        return resolve_backend(torch.device(device_type)) if device_type else None

    @property
    def _layer_sync(self) -> Any:
        """Lightning's layer-sync plugin (``sync_batchnorm=True``), made to run on the device.

        The Trainer sets Lightning's ``TorchSyncBatchNorm`` here; it is wrapped in
        :class:`~lightning_anyaccel.sync_batchnorm.DeviceLayerSync`, which converts to torch's
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
        assert self._timeout is not None
        return self._timeout

    def _resolve_backend(self) -> str:
        return resolve_backend(self.root_device, self._process_group_backend)

    @override
    def _get_process_group_backend(self) -> str:
        """Lightning's hook for the backend: the device table's choice, never ``fake`` or a silent ``gloo``."""
        return self._resolve_backend()

    def _check_start_method(self) -> None:
        """Say which strategy to use when the start method can not work here (notebooks, no ``fork``)."""
        if self._start_method in ("fork", "forkserver") and self._start_method not in mp.get_all_start_methods():
            raise NotebookLaunchError(
                f"strategy={self.strategy_name!r} needs the {self._start_method!r} start method, which this platform"
                f" does not have (it has {', '.join(mp.get_all_start_methods())}). Run your code as a script with"
                " strategy='any_ddp', or use 'any_ddp_spawn'."
            )
        if _lightning.is_interactive() and self._start_method not in ("fork", "forkserver"):
            raise NotebookLaunchError(
                f"strategy={self.strategy_name!r} (start method {self._start_method!r}) can not run from a notebook or"
                " an interactive session: 'popen' re-runs a script and 'spawn' can not pickle functions defined"
                " there. Use strategy='any_ddp_notebook' (fork), or run your code as a script."
            )

    def _validate_device_setup(self) -> None:
        supervision.supervise_worker(self.global_rank)  # a worker dies with its launching process
        super()._validate_device_setup()
        self._check_start_method()
        if self._start_method in ("fork", "forkserver"):
            check_fork_safe(self.device_type)
        self._resolve_backend()

    @override
    def _configure_launcher(self) -> None:
        """Adopt an MPI launcher's layout, then Lightning's launcher for popen, the fork-checked one otherwise."""
        self._adopt_launcher_environment()
        if self._start_method == "popen":
            super()._configure_launcher()  # type: ignore[misc]
        else:
            self._launcher = _lightning.port(self._launcher_class, self._front_end)(self, start_method=self._start_method)
        if not self.cluster_environment.creates_processes_externally:  # this process starts the workers
            supervision.prepare_launch()
        if self.parallel_devices:
            self._validate_device_setup()

    def _adopt_launcher_environment(self) -> None:
        """Use :class:`AnyMPIEnvironment` under an MPI launcher, and check the layout early.

        Lightning picks its generic environment (or ``MPIEnvironment``, which needs ``mpi4py``
        and derives nodes from host names) for ``mpiexec`` jobs; each rank would then start
        its own workers. Runs in the launching process, before any worker or connection.
        """
        env = self.cluster_environment
        generic = tuple(_lightning.port(cls, self._front_end) for cls in (LightningEnvironment, MPIEnvironment))
        if type(env) in generic and AnyMPIEnvironment.detect():
            self.cluster_environment = _lightning.port(AnyMPIEnvironment, self._front_end)()
            self._set_ranks()
        elif type(env) is generic[0]:
            world_size = os.environ.get("WORLD_SIZE")
            rendezvous.check_layout(
                num_nodes=self.num_nodes,
                num_processes=self.num_processes,
                node_rank=env.node_rank(),
                local_rank=env.local_rank(),
                world_size=int(world_size) if world_size else None,
            )

    def _set_ranks(self) -> None:
        """Set global rank and world size from the cluster environment (the front end's method)."""
        getattr(self, self._set_world_ranks_attr)()

    @override
    def _check_setup(self) -> None:
        """Also: check the layout and name gloo's interface (the launcher watch starts in ``_validate_device_setup``)."""
        super()._check_setup()
        env = self.cluster_environment
        self._set_ranks()
        rendezvous.check_layout(
            num_nodes=self.num_nodes,
            num_processes=self.num_processes,
            node_rank=self.node_rank,
            local_rank=self.local_rank,
            world_size=env.world_size(),
            global_rank=env.global_rank(),
        )
        rendezvous.configure_socket_interface(env.main_address)

    @override
    def _lightning_setup(self) -> None:
        """Lightning's setup, ended with a message if the rendezvous outlives ``timeout`` (plus a grace)."""
        env = self.cluster_environment
        address, port = env.main_address, env.main_port
        seconds = self.timeout.total_seconds() + rendezvous.RENDEZVOUS_GRACE_S
        message = (
            f"rank {env.global_rank()}/{env.world_size()}: the rendezvous at {address}:{port} did not complete."
            f" Check that all {self.num_nodes} node(s) started with the same MASTER_ADDR/MASTER_PORT and distinct"
            " NODE_RANKs, that the port is not used by another program, and that no firewall blocks it"
        )
        with rendezvous.Deadline(seconds, message):
            super()._lightning_setup()

    @override
    def _finish_setup(self) -> None:
        """Also: destroy the process group at exit."""
        super()._finish_setup()
        self._destroy_at_exit()

    def on_exception(self, exception: BaseException) -> None:
        """Say which rank failed and why the others stop, for errors of the process group (Trainer hook)."""
        super().on_exception(exception)  # type: ignore[misc]
        if self.world_size > 1 and _is_distributed_failure(exception):
            log.error(
                "[lightning_anyaccel] rank %d/%d: a collective failed (%s). Another process of this job died,"
                " froze or lost its connection (timeout %s); the job stops on every rank.",
                self.global_rank, self.world_size, type(exception).__name__, self.timeout,
            )

    def _destroy_at_exit(self) -> None:
        """Destroy the process group at exit for every backend (Lightning does it for NCCL only)."""
        atexit.register(_lightning.private("lightning.fabric.utilities.distributed", "_destroy_dist_connection"))

    def _wrap_ddp(self, module: torch.nn.Module, device_ids: list[int] | None) -> Any:
        """Wrap ``module`` in DDP on the current stream, as plain PyTorch does, on every device type.

        Lightning 2.6 builds DDP inside a new ``torch.cuda.Stream`` where device ids are set: that
        fails on non-CUDA builds (Lightning-AI/pytorch-lightning#19766), and on CUDA with torch >= 2.10
        makes every backward warn that the AccumulateGrad node's stream does not match (seen on an
        H100; Lightning-AI/pytorch-lightning#21567, removed upstream by #21746).
        """
        return DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)

    def _barrier(self) -> None:
        """A barrier on the device the process group was bound to (no NCCL-only ``device_ids``)."""
        if _lightning.private("lightning.fabric.utilities.distributed", "_distributed_is_initialized")():
            torch.distributed.barrier()

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        """Synchronise all processes, on any backend (see :meth:`_barrier`)."""
        self._barrier()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register every name of :data:`START_METHODS` with its start method, also ``..._find_unused_parameters_true``."""
        for name, start_method in START_METHODS.items():
            description = f"DDP on the accelerator's device type, start method {start_method!r}"
            strategy_registry.register(name, cls, description=description, start_method=start_method, override=True)
            strategy_registry.register(
                f"{name}_find_unused_parameters_true", cls, description=description + ", find_unused_parameters=True",
                start_method=start_method, find_unused_parameters=True, override=True,
            )


class TrainerParameterMovesMixin:
    """Trainer: optimizers step the parameters the model trains, even where moving it replaced them.

    An optimizer the user built before ``fit`` (in ``__init__``, returned by ``configure_optimizers``)
    holds the CPU parameters a replacing move left behind (see :mod:`lightning_anyaccel.optimizer_params`).
    Mixed in before the package's single-device and DDP strategies.
    """

    model: Any
    root_device: torch.device
    optimizers: list[Any]

    @override
    def model_to_device(self) -> None:
        before = named_parameters(self.model) if self.model is not None else {}
        super().model_to_device()  # type: ignore[misc]
        _parameter_moves(self).update(replaced_parameters(before, self.model) if before else {})

    @override
    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)  # type: ignore[misc]
        module = self.lightning_module  # type: ignore[attr-defined]
        for optimizer in self.optimizers:
            repoint_optimizer(optimizer, _parameter_moves(self), self.root_device,
                              current=module.parameters() if module is not None else (),
                              fix="build the optimizer in configure_optimizers() from self.parameters(), not before fit")


class FabricParameterMovesMixin:
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
        super().module_to_device(module)  # type: ignore[misc]
        _parameter_moves(self).update(replaced_parameters(before, module))
        _set_up_parameters(self).update((id(p), p) for p in module.parameters())

    @override
    def setup_module(self, module: torch.nn.Module) -> Any:
        module = super().setup_module(module)  # type: ignore[misc]
        _set_up_parameters(self).update((id(p), p) for p in module.parameters())
        return module

    @override
    def setup_optimizer(self, optimizer: Any) -> Any:
        repoint_optimizer(optimizer, _parameter_moves(self), self.root_device,
                          current=_set_up_parameters(self).values(),
                          fix="call fabric.setup_module(model) first, build the optimizer from the returned"
                              " module's parameters, then fabric.setup_optimizers(optimizer)")
        return super().setup_optimizer(optimizer)  # type: ignore[misc]


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


class SafeLaunchMixin:
    """Mixed in before Lightning's multiprocessing launcher (Trainer's or Fabric's).

    Two fixes over Lightning's launcher, which only knows its own CPU/CUDA accelerators:

    - refuse a ``fork`` when the strategy's device type was already initialised in the parent
      (Lightning only checks CUDA), right before the processes start;
    - under ``spawn`` on CPU, give every process its own copy of the model: torch moves tensors
      passed through ``spawn`` into shared memory, so without this all ranks would step the same
      weights (Lightning does it only for ``CPUAccelerator``, not for other accelerators on CPU).
    """

    _start_method: str
    _strategy: Any

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        if self._start_method in ("fork", "forkserver"):
            check_fork_safe(self._strategy.root_device.type)
        return super().launch(function, *args, **kwargs)  # type: ignore[misc]

    @override
    def _wrapping_function(self, process_idx: int, *rest: Any) -> Any:
        if self._start_method == "spawn" and self._strategy.root_device.type == "cpu":
            rest = _lightning.private(
                "lightning.fabric.strategies.launchers.multiprocessing", "_disable_module_memory_sharing"
            )(rest)
        with supervision.report_failure(lambda: self._strategy.global_rank):  # name the failed rank
            return super()._wrapping_function(process_idx, *rest)  # type: ignore[misc]


def _is_distributed_failure(exception: BaseException) -> bool:
    """Whether ``exception`` came from the process group (a peer died, froze or disconnected)."""
    if isinstance(exception, torch.distributed.DistError):
        return True
    text = str(exception)
    return isinstance(exception, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset", "Timed out", "timed out")
    )
