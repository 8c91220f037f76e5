"""Behaviour shared by every strategy of the package, for the Trainer and for Fabric.

The Trainer strategies (:mod:`lightning_anyaccel.strategies`) and the Fabric strategies
(:mod:`lightning_anyaccel.fabric`) differ only in what Lightning base class they extend and in
the name of a few Lightning attributes; everything that knows about devices (precision
alignment, backend choice, fork safety, notebook launches, DDP wrapping, barriers, the lazy
single device, portable checkpoint loading, registration, and the sharded strategies' device logic
for FSDP, FSDP2 and DeepSpeed) lives here once.

Example (the same mixin under both front ends):
    >>> from lightning_anyaccel.strategies import AnyDDPStrategy as TrainerDDP
    >>> from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDP
    >>> issubclass(TrainerDDP, AnyDistributedMixin) and issubclass(FabricDDP, AnyDistributedMixin)
    True
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.multiprocessing as mp
from lightning.fabric.strategies.deepspeed import _validate_device_index_selection
from lightning.fabric.strategies.fsdp import _move_torchmetrics_to_device, _setup_activation_checkpointing
from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing
from lightning.fabric.utilities import imports as _lightning_imports
from lightning.fabric.utilities.distributed import _destroy_dist_connection, _distributed_is_initialized
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.seed import reset_seed
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_anyaccel import rendezvous
from lightning_anyaccel.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.devices import DEVICE_TABLE, DeviceSpec, get_spec
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


class ShardingNotSupportedError(ValueError):
    """The sharded strategy cannot run with this device or these options."""


class AnyShardedMixin(AnyDistributedMixin):
    """Overrides shared by the sharded strategies (FSDP, FSDP2/model-parallel, DeepSpeed).

    Sharding splits parameters, gradients and optimizer state across processes, so it needs a
    collective backend on the device; the process group is bound to the device when it has an
    index, and every device mesh is built on the strategy's device type (Lightning builds FSDP
    meshes on ``"cuda"``, audit row 25).
    """

    #: How the strategy is called in messages.
    _sharding_name: str = "Sharded training"
    _start_method: str = "popen"

    @property
    def _spec(self) -> DeviceSpec:
        return get_spec(self.device_type)

    def _check_sharding(self) -> None:
        """Refuse devices without collectives (e.g. ``mps``) before any process starts."""
        if self._spec.backend is None:
            raise ShardingNotSupportedError(
                f"{self._sharding_name} splits the model across processes, but {self._spec.name}"
                f" ({self.device_type!r}) has no collective backend and runs one device per machine."
                " Use strategy='any_single' there, or a device type with several devices."
            )

    def _validate_device_setup(self) -> None:
        self._check_sharding()
        super()._validate_device_setup()

    def _process_group_device(self) -> torch.device | None:
        """The device to bind the process group to: the root device when it has an index (not on CPU)."""
        return self.root_device if self.root_device.index is not None else None

    def _init_device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
        """A ``DeviceMesh`` of ``shape`` on the strategy's device type."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device_type, tuple(shape), mesh_dim_names=names)


def full_state_dict_context(module: torch.nn.Module, offload: bool, rank0_only: bool = True) -> AbstractContextManager:
    """FSDP's full-state-dict mode for ``module``, offloading gathered tensors to CPU only if ``offload``.

    Lightning's own helper (both front ends) always offloads, which crashes torch when FSDP runs
    on CPU (see :attr:`~lightning_anyaccel.devices.DeviceSpec.fsdp_full_state_offload`).
    """
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
    )


class AnyFSDPMixin(AnyShardedMixin):
    """FSDP (Lightning's ``FSDPStrategy`` interface) on the device type, for the Trainer and for Fabric.

    Mixed in before either front end's ``FSDPStrategy``. What differs between them is named by
    class attributes: where the FSDP keyword arguments live (:attr:`_fsdp_kwargs_attr`), the
    front end's ``FSDPPrecision`` and the package's replacement for it. The front-end classes
    only route their hooks (``_setup_model``/``setup_module``, ``model_sharded_context``/
    ``module_sharded_context``, checkpoint hooks) to the methods here.

    Args:
        state_dict_offload: move gathered full-state-dict tensors to CPU while saving
            (``state_dict_type="full"``). ``None`` (default) takes the device table's
            ``fsdp_full_state_offload`` (on except on CPU, where it crashes torch).
        *args, **kwargs: the front end's ``FSDPStrategy`` arguments.
    """

    strategy_name: ClassVar[str] = "any_fsdp"
    _sharding_name = "FSDP"
    #: The attribute holding the extra ``FullyShardedDataParallel`` arguments (Trainer: ``kwargs``).
    _fsdp_kwargs_attr: ClassVar[str] = "kwargs"
    #: The front end's ``FSDPPrecision`` class (autocasts on ``"cuda"``) and the package's one for it.
    _lightning_fsdp_precision: ClassVar[type]
    _any_fsdp_precision: ClassVar[type]
    _state_dict_type: str
    _activation_checkpointing_kwargs: dict[str, Any]
    cpu_offload: Any
    sharding_strategy: Any
    mixed_precision_config: Any

    def __init__(self, *args: Any, state_dict_offload: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state_dict_offload = state_dict_offload

    @property
    def _fsdp_options(self) -> dict[str, Any]:
        return getattr(self, self._fsdp_kwargs_attr)

    @property
    def state_dict_offload(self) -> bool:
        """Whether full state dicts are gathered with ``offload_to_cpu`` (the table decides unless given)."""
        if self._state_dict_offload is not None:
            return self._state_dict_offload
        return self._spec.fsdp_full_state_offload

    @override
    def _validate_device_setup(self) -> None:
        """Also refuse ``state_dict_offload=True`` for full state dicts where torch crashes on it (CPU)."""
        super()._validate_device_setup()
        if self._state_dict_offload and self._state_dict_type == "full" and not self._spec.fsdp_full_state_offload:
            raise ShardingNotSupportedError(
                f"{type(self).__name__}(state_dict_offload=True, state_dict_type='full') on {self._spec.name}: torch's"
                " FSDP frees storage it still reads when it 'offloads' tensors that already live on CPU, and the"
                " process crashes (Lightning-AI/pytorch-lightning#21804). Leave state_dict_offload unset, or use"
                " state_dict_type='sharded'."
            )

    @override
    def _align_precision(self) -> None:
        """Replace the front end's CUDA-bound ``FSDPPrecision`` with the package's one on the device type."""
        plugin = getattr(self, "_" + self._precision_attr)  # the plugin given, not Lightning's 32-true default
        if isinstance(plugin, self._lightning_fsdp_precision) and not isinstance(plugin, self._any_fsdp_precision):
            plugin = self._any_fsdp_precision(plugin.precision, device=self.device_type)
        if plugin is not None:
            setattr(self, self._precision_attr, align_precision_plugin(plugin, self.device_type))

    def _setup_fsdp_environment(self, lightning_setup: Callable[[], None]) -> None:
        """Run the front end's ``setup_environment`` with a ``device_mesh`` tuple built on the device type.

        Lightning would build a ``(replicas, shards)`` tuple with ``init_device_mesh("cuda", ...)``.
        """
        self._validate_device_setup()
        shape = self._fsdp_options.get("device_mesh")
        if isinstance(shape, tuple):
            del self._fsdp_options["device_mesh"]
        lightning_setup()
        self._destroy_at_exit()
        self._check_device_precision()
        if isinstance(shape, tuple):
            self._fsdp_options["device_mesh"] = self._init_device_mesh(shape, ("replicate", "shard"))

    def _fsdp_wrap_kwargs(self) -> dict[str, Any]:
        """Arguments for every ``FullyShardedDataParallel`` the strategy builds: ``device_id`` is the device.

        Lightning passes ``root_device.index``: ``None`` on CPU, which FSDP resolves to "the
        current accelerator" and fails.
        """
        return dict(
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self._fsdp_options,
        )

    def _wrap_fsdp(self, module: torch.nn.Module, already_wrapped: Callable[[], Any]) -> Any:
        """Wrap ``module`` in FSDP on the device; ``already_wrapped()`` (Lightning's path) when the user did."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(submodule, FullyShardedDataParallel) for submodule in module.modules()):
            return already_wrapped()
        wrapped = FullyShardedDataParallel(module=module, **self._fsdp_wrap_kwargs())
        _move_torchmetrics_to_device(wrapped, self.root_device)
        _setup_activation_checkpointing(wrapped, self._activation_checkpointing_kwargs)
        return wrapped

    def _fsdp_enable_wrap(self) -> AbstractContextManager:
        """``enable_wrap`` with :meth:`_fsdp_wrap_kwargs`, for the sharded-init contexts."""
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        return enable_wrap(wrapper_cls=FullyShardedDataParallel, **self._fsdp_wrap_kwargs())

    def _full_state_dict_context(self, module: torch.nn.Module, rank0_only: bool = True) -> AbstractContextManager:
        """FSDP's full-state-dict mode, offloading to CPU only where :attr:`state_dict_offload` allows it."""
        return full_state_dict_context(module, self.state_dict_offload, rank0_only)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register ``any_fsdp`` and ``any_fsdp_cpu_offload`` (parameters offloaded to host memory)."""
        strategy_registry.register(
            "any_fsdp", cls, description="FSDP on the accelerator's device type", override=True
        )
        strategy_registry.register(
            "any_fsdp_cpu_offload",
            cls,
            description="FSDP on the accelerator's device type, parameters offloaded to CPU",
            cpu_offload=True,
            override=True,
        )


class AnyModelParallelMixin(AnyShardedMixin):
    """FSDP2 (``fully_shard``) and tensor parallelism through Lightning's ``ModelParallelStrategy`` (either front end).

    Lightning builds its device mesh on ``root_device.type`` already; what the mixin adds is the
    device table's backend, the barrier, the refusal of devices without collectives, and the
    ``any_fsdp2`` layout: with ``tensor_parallel_size=1`` every process is in the sharding
    dimension (Lightning's ``data_parallel_size="auto"`` would make it the number of nodes).
    """

    strategy_name: ClassVar[str] = "any_model_parallel"
    _sharding_name = "FSDP2 (ModelParallelStrategy)"
    _data_parallel_size: Any
    _tensor_parallel_size: Any
    num_nodes: int
    num_processes: int

    def _setup_model_parallel_environment(self, lightning_setup: Callable[[], None]) -> None:
        """Validate, size the mesh for pure FSDP2, then run the front end's ``setup_environment``."""
        self._validate_device_setup()
        if self._tensor_parallel_size == 1 and self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        lightning_setup()
        self._destroy_at_exit()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register ``any_model_parallel`` (Lightning's defaults) and ``any_fsdp2`` (``tensor_parallel_size=1``)."""
        strategy_registry.register(
            "any_model_parallel", cls, description="FSDP2 + tensor parallel on the accelerator's device type",
            override=True,
        )
        strategy_registry.register(
            "any_fsdp2", cls, description="FSDP2 (fully_shard) on the accelerator's device type",
            tensor_parallel_size=1, override=True,
        )


#: Registered DeepSpeed name -> arguments (the same names for the Trainer and for Fabric).
DEEPSPEED_NAMES: dict[str, dict[str, Any]] = {
    "any_deepspeed": {},
    "any_deepspeed_stage_1": {"stage": 1},
    "any_deepspeed_stage_2": {"stage": 2},
    "any_deepspeed_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "any_deepspeed_stage_3": {"stage": 3},
    "any_deepspeed_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
}


class DeepSpeedNotInstalledError(ImportError):
    """The ``deepspeed`` package is not installed."""


def deepspeed_device_types() -> list[str]:
    """The device types DeepSpeed runs on, from the device table.

    >>> deepspeed_device_types()
    ['cpu', 'cuda', 'hpu', 'npu', 'xpu']
    """
    return sorted(t for t, spec in DEVICE_TABLE.items() if spec.deepspeed_accelerator)


class AnyDeepSpeedMixin(AnyShardedMixin):
    """DeepSpeed on the device types DeepSpeed's accelerator layer knows, for the Trainer and for Fabric.

    Mixed in before either front end's ``DeepSpeedStrategy``: replaces Lightning's CUDA-only
    check with the device table (``DS_ACCELERATOR`` is set from it), validates device indices
    only where devices have them, and gives ``deepspeed.initialize`` a device rank on every
    device (Lightning passes ``root_device.index``, ``None`` on CPU).

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    strategy_name: ClassVar[str] = "any_deepspeed"
    _sharding_name = "DeepSpeed"
    config: Any
    local_rank: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise DeepSpeedNotInstalledError(
                f"{type(self).__name__} needs DeepSpeed: `pip install lightning-anyaccel[deepspeed]`"
                " (on machines without a CUDA toolkit: `DS_BUILD_OPS=0 pip install deepspeed`)."
                " Or use strategy='any_fsdp', which needs nothing beyond torch."
            )
        super().__init__(*args, **kwargs)

    @property
    def deepspeed_accelerator(self) -> str:
        """The name of this device type in DeepSpeed's accelerator layer.

        Raises:
            ShardingNotSupportedError: DeepSpeed does not run on the device type.
        """
        name = self._spec.deepspeed_accelerator
        if name is None:
            raise ShardingNotSupportedError(
                f"DeepSpeed is not enabled for {self._spec.name} ({self.device_type!r}) in the device table; it runs on"
                f" {', '.join(deepspeed_device_types())}. Use strategy='any_fsdp' or 'any_fsdp2' to shard on"
                f" {self.device_type!r}."
            )
        return name

    def _select_deepspeed_accelerator(self) -> None:
        """Make DeepSpeed use the strategy's device type (``DS_ACCELERATOR``), or refuse a conflicting choice."""
        name = self.deepspeed_accelerator
        chosen = os.environ.get("DS_ACCELERATOR")
        if chosen and chosen != name:
            raise ShardingNotSupportedError(
                f"DS_ACCELERATOR={chosen!r} is set, but the strategy trains on {self.device_type!r}."
                f" Unset DS_ACCELERATOR or set it to {name!r}."
            )
        os.environ["DS_ACCELERATOR"] = name  # inherited by the processes the launcher starts

    @override
    def _validate_device_setup(self) -> None:
        self._select_deepspeed_accelerator()  # first: "DeepSpeed does not run here" beats a backend message
        super()._validate_device_setup()

    def _check_active_deepspeed_accelerator(self) -> None:
        """After setup: refuse a DeepSpeed that already picked another accelerator in this process."""
        from deepspeed.accelerator import get_accelerator

        active = get_accelerator().device_name()
        if active != self.deepspeed_accelerator:
            raise ShardingNotSupportedError(
                f"DeepSpeed already chose its {active!r} accelerator in this process, but the strategy trains on"
                f" {self.device_type!r}. Set DS_ACCELERATOR={self.deepspeed_accelerator} before importing deepspeed."
            )

    def _setup_deepspeed_distributed(self, set_world_ranks: Callable[[], None]) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group."""
        parallel_devices = self.parallel_devices
        assert parallel_devices is not None
        if self._process_group_device() is not None:
            _validate_device_index_selection(parallel_devices)
        reset_seed()
        set_world_ranks()
        self._init_deepspeed_distributed()  # type: ignore[attr-defined]
        self._destroy_at_exit()

    @property
    def device_rank(self) -> int:
        """The device DeepSpeed binds this process to: the device index, else the local rank (CPU)."""
        index = self.root_device.index
        return index if index is not None else self.local_rank

    def _deepspeed_initialize(self, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None) -> tuple:
        """``deepspeed.initialize`` with :attr:`device_rank`: (engine, optimizer, dataloader, scheduler)."""
        import deepspeed

        return deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.device_rank),
            config=self.config,
            model=model,
            model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register every name of :data:`DEEPSPEED_NAMES` with its arguments."""
        for name, arguments in DEEPSPEED_NAMES.items():
            strategy_registry.register(
                name, cls, description=f"DeepSpeed on the accelerator's device type {arguments}", override=True,
                **arguments,
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
        return super()._wrapping_function(process_idx, *rest)  # type: ignore[misc]
