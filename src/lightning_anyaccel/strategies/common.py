"""Behaviour shared by every strategy of the package, for the Trainer and for Fabric.

The Trainer strategies (:mod:`lightning_anyaccel.strategies`) and the Fabric strategies
(:mod:`lightning_anyaccel.fabric`) differ only in what Lightning base class they extend and in
the name of a few Lightning attributes; everything that knows about devices (precision
alignment, backend choice, fork safety, notebook launches, DDP wrapping, barriers, the lazy
single device, atomic checkpoints, registration) lives here once; the sharded strategies' device
logic builds on it in :mod:`lightning_anyaccel.strategies.sharding`.

Example (the same mixin under both front ends):
    >>> from lightning_anyaccel.strategies import AnyDDPStrategy as TrainerDDP
    >>> from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDP
    >>> issubclass(TrainerDDP, AnyDistributedMixin) and issubclass(FabricDDP, AnyDistributedMixin)
    True
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.multiprocessing as mp
from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing
from lightning.fabric.utilities import imports as _lightning_imports
from lightning.fabric.utilities.distributed import _destroy_dist_connection, _distributed_is_initialized
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel import rendezvous, supervision
from lightning_anyaccel.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.devices import get_spec
from lightning_anyaccel.distributed import check_fork_safe, resolve_backend
from lightning_anyaccel.precision import align_precision_plugin, check_device_supports

#: Registered DDP name -> start method (the same names for the Trainer and for Fabric).
START_METHODS: dict[str, str] = {
    "any_ddp": "popen",
    "any_ddp_spawn": "spawn",
    "any_ddp_fork": "fork",
    "any_ddp_notebook": "fork",
}


class NotebookLaunchError(MisconfigurationException, RuntimeError):
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

    @property
    def device_type(self) -> str:
        """The device type this strategy trains on (``self.root_device.type``)."""
        return self.root_device.type

    def _check_accelerator(self) -> None:
        """Refuse an accelerator of another device type than the strategy's devices."""
        accelerator_type = getattr(self.accelerator, "device_type", None)
        if accelerator_type is not None and accelerator_type != self.device_type:
            raise ValueError(
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
            self._checkpoint_io = AtomicCheckpointIO()
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
        device: a device such as ``"xpu:1"``; ``None`` (default) takes the device selected by the
            ``accelerator`` and ``devices`` arguments.
        **kwargs: the Lightning ``SingleDeviceStrategy`` arguments (accelerator, checkpoint_io, precision).
    """

    _root_device: torch.device | None

    def __init__(self, device: str | torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(device="cpu", **kwargs)  # type: ignore[call-arg]
        self._root_device = torch.device(device) if device is not None else None

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

    @override
    def setup_environment(self) -> None:
        self._validate_device_setup()
        super().setup_environment()  # type: ignore[misc]
        self._check_device_precision()


class AnyDistributedMixin(AnyStrategyMixin):
    """DDP-family overrides: launcher, backend, process-group lifetime, DDP wrapping, barrier, fork check."""

    _process_group_backend: str | None
    _ddp_kwargs: dict[str, Any]
    _start_method: str
    parallel_devices: list[torch.device] | None
    _launcher: Any
    #: The front end's multiprocessing launcher class with :class:`SafeLaunchMixin` mixed in.
    _launcher_class: ClassVar[type]
    strategy_name: ClassVar[str] = "any_ddp"

    def __init__(self, *args: Any, timeout: timedelta | None = None, **kwargs: Any) -> None:
        """``timeout=None`` means :func:`~lightning_anyaccel.rendezvous.default_timeout` (10 min, or
        ``$LIGHTNING_ANYACCEL_TIMEOUT`` seconds)."""
        super().__init__(*args, timeout=timeout or rendezvous.default_timeout(), **kwargs)

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
        if _lightning_imports._IS_INTERACTIVE and self._start_method not in ("fork", "forkserver"):
            raise NotebookLaunchError(
                f"strategy={self.strategy_name!r} (start method {self._start_method!r}) can not run from a notebook or"
                " an interactive session: 'popen' re-runs a script and 'spawn' can not pickle functions defined"
                " there. Use strategy='any_ddp_notebook' (fork), or run your code as a script."
            )

    def _validate_device_setup(self) -> None:
        supervision.supervise_worker(self.global_rank)  # [faults] a worker dies with its launching process
        super()._validate_device_setup()
        self._check_start_method()
        if self._start_method in ("fork", "forkserver"):
            check_fork_safe(self.device_type)
        self._resolve_backend()

    @override
    def _configure_launcher(self) -> None:
        """Lightning's launcher for popen; the fork-checked multiprocessing launcher otherwise."""
        if self._start_method == "popen":
            super()._configure_launcher()  # type: ignore[misc]
        else:
            self._launcher = self._launcher_class(self, start_method=self._start_method)
        if not self.cluster_environment.creates_processes_externally:  # [faults] this process starts the workers
            supervision.prepare_launch()
        if self.parallel_devices:
            self._validate_device_setup()

    def _destroy_at_exit(self) -> None:
        """Destroy the process group at exit for every backend (Lightning does it for NCCL only)."""
        atexit.register(_destroy_dist_connection)

    def _wrap_ddp(self, module: torch.nn.Module, device_ids: list[int] | None, default: Callable[[], Any]) -> Any:
        """Wrap ``module`` in DDP; only devices whose table row says so use Lightning's side stream."""
        if get_spec(self.device_type).ddp_side_stream:
            return default()
        return DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)

    def _barrier(self) -> None:
        """A barrier on the device the process group was bound to (no NCCL-only ``device_ids``)."""
        if _distributed_is_initialized():
            torch.distributed.barrier()

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        """Synchronise all processes, on any backend (see :meth:`_barrier`)."""
        self._barrier()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register every name of :data:`START_METHODS` with its start method."""
        for name, start_method in START_METHODS.items():
            strategy_registry.register(
                name,
                cls,
                description=f"DDP on the accelerator's device type, start method {start_method!r}",
                start_method=start_method,
                override=True,
            )


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
            rest = _disable_module_memory_sharing(rest)
        with supervision.report_failure(lambda: self._strategy.global_rank):  # [faults] name the failed rank
            return super()._wrapping_function(process_idx, *rest)  # type: ignore[misc]
