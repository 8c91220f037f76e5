"""Device logic of the sharded strategies (FSDP, FSDP2, DeepSpeed), for the Trainer and for Fabric.

Sharding splits parameters, gradients and optimizer state across processes. Lightning's FSDP,
ModelParallel and DeepSpeed strategies assume CUDA in their precision plugins, device meshes,
device ids and accelerator checks (audit rows 7, 9, 25, 26); the mixins here replace those parts
from the device table. The Trainer classes (:mod:`lightning_anyaccel.strategies.fsdp`,
``.model_parallel``, ``.deepspeed``) and Fabric's (:mod:`lightning_anyaccel.fabric`) only route
Lightning's hooks to them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from lightning.fabric.utilities.seed import reset_seed
from typing_extensions import override

from lightning_anyaccel import _lightning, build_locks, rendezvous
from lightning_anyaccel.devices import DEVICE_TABLE, DeviceSpec, get_spec
from lightning_anyaccel.precision import align_precision_plugin
from lightning_anyaccel.strategies.common import AnyDistributedMixin
from lightning_anyaccel.troubleshooting import LinkedError


class ShardingNotSupportedError(LinkedError, ValueError):
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
        kwargs: the front end's ``FSDPStrategy`` arguments (positional ones pass through too).
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

    @override
    def _lightning_setup(self) -> None:
        """Lightning's setup, with a ``device_mesh`` tuple built on the device type afterwards.

        Lightning would build a ``(replicas, shards)`` tuple with ``init_device_mesh("cuda", ...)``.
        """
        shape = self._fsdp_options.get("device_mesh")
        if isinstance(shape, tuple):
            del self._fsdp_options["device_mesh"]
        super()._lightning_setup()
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
        _lightning.private("lightning.fabric.strategies.fsdp", "_move_torchmetrics_to_device")(wrapped, self.root_device)
        _lightning.private("lightning.fabric.strategies.fsdp", "_setup_activation_checkpointing")(
            wrapped, self._activation_checkpointing_kwargs
        )
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

    @override
    def _check_setup(self) -> None:
        """Also size the mesh for pure FSDP2 (every process in the sharding dimension)."""
        super()._check_setup()
        if self._tensor_parallel_size == 1 and self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes

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


#: The ``DS_ACCELERATOR`` values the package set in this process (a user's own value is never in it).
_DS_ACCELERATOR_SET: set[str] = set()


class DeepSpeedNotInstalledError(LinkedError, ImportError):
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
    _lightning_setup_skips = "lightning.pytorch.strategies.DeepSpeedStrategy"  # Fabric: set by its class
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
        """Make DeepSpeed use the strategy's device type (``DS_ACCELERATOR``), or refuse a conflicting choice.

        A value the package itself set for an earlier strategy in this process is replaced; a value
        set by the user is respected (and refused when it names another device type). Whether
        DeepSpeed already chose another accelerator in this process is checked after setup.
        """
        name = self.deepspeed_accelerator
        chosen = os.environ.get("DS_ACCELERATOR")
        if chosen and chosen != name and chosen not in _DS_ACCELERATOR_SET:
            raise ShardingNotSupportedError(
                f"DS_ACCELERATOR={chosen!r} is set, but the strategy trains on {self.device_type!r}."
                f" Unset DS_ACCELERATOR or set it to {name!r}."
            )
        os.environ["DS_ACCELERATOR"] = name  # inherited by the processes the launcher starts
        _DS_ACCELERATOR_SET.add(name)

    @override
    def _validate_device_setup(self) -> None:
        self._select_deepspeed_accelerator()  # first: "DeepSpeed does not run here" beats a backend message
        super()._validate_device_setup()

    @override
    def _check_setup(self) -> None:
        """Also refuse a device whose vendor package (which DeepSpeed's accelerator imports) is missing.

        DeepSpeed's accelerator for a vendor device imports the vendor's package (``torch_npu``,
        ``habana_frameworks.torch``, ...). Without it, DeepSpeed falls back to its CPU accelerator
        while the tensors live on the device, and its start-up waits forever (seen with a device
        registered by another PrivateUse1 backend). Checked in every worker, before Lightning's setup.
        """
        super()._check_setup()
        module = self._spec.vendor_module
        if module is not None and importlib.util.find_spec(module.split(".")[0]) is None:
            raise ShardingNotSupportedError(
                f"DeepSpeed's {self.deepspeed_accelerator!r} accelerator needs `{module}`, which is not installed here"
                f" (the {self.device_type!r} device comes from another backend). Use strategy='any_fsdp' or"
                " 'any_fsdp2', which need nothing beyond torch."
            )

    @override
    def _finish_setup(self) -> None:
        """Also refuse a DeepSpeed that already picked another accelerator in this process."""
        super()._finish_setup()
        self._check_active_deepspeed_accelerator()

    def _check_active_deepspeed_accelerator(self) -> None:
        """After setup: refuse a DeepSpeed that already picked another accelerator in this process."""
        from deepspeed.accelerator import get_accelerator

        active = get_accelerator().device_name()
        if active != self.deepspeed_accelerator:
            raise ShardingNotSupportedError(
                f"DeepSpeed already chose its {active!r} accelerator in this process, but the strategy trains on"
                f" {self.device_type!r}. Set DS_ACCELERATOR={self.deepspeed_accelerator} before importing deepspeed."
            )

    def _setup_deepspeed_distributed(self) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group.

        Both front ends call this from their process-group hook (Trainer: ``setup_distributed``;
        Fabric: ``_setup_distributed``), inside step 2 of the setup sequence.
        """
        parallel_devices = self.parallel_devices
        assert parallel_devices is not None
        if self._process_group_device() is not None and self._spec.process_device_env is None:  # Gaudi: all hpu:0
            _lightning.private("lightning.fabric.strategies.deepspeed", "_validate_device_index_selection")(
                parallel_devices
            )
        reset_seed()
        self._set_ranks()
        build_locks.wait_for_build_locks()  # DeepSpeed may compile an op here; torch would wait on a stale lock forever
        self._init_deepspeed_distributed()  # type: ignore[attr-defined]
        rendezvous.bound_deepspeed_groups(self._timeout)  # DeepSpeed's own groups honour the timeout too

    @property
    def device_rank(self) -> int:
        """The device DeepSpeed binds this process to: the device index, else the local rank (CPU)."""
        index = self.root_device.index
        return index if index is not None else self.local_rank

    def _deepspeed_initialize(
        self, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, *,
        config: dict[str, Any] | None = None, model_parameters: Any = None,
    ) -> tuple:
        """``deepspeed.initialize`` with :attr:`device_rank`: (engine, optimizer, dataloader, scheduler).

        ``config`` defaults to the strategy's, ``model_parameters`` to the trainable parameters
        (the Trainer's inference engine passes its own config and none).
        """
        import deepspeed

        build_locks.wait_for_build_locks()  # the optimizer's op (e.g. cpu_adam) may compile here
        return deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.device_rank),
            config=self.config if config is None else config,
            model=model,
            model_parameters=(
                filter(lambda p: p.requires_grad, model.parameters()) if model_parameters is None else model_parameters
            ),
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
