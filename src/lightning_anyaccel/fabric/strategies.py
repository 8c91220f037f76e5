"""Fabric strategies: one device, DDP, or sharded (FSDP, FSDP2, DeepSpeed) on any device type.

The bodies are the shared mixins of :mod:`lightning_anyaccel.strategies.common` (the Trainer
strategies use the same ones); what is here is only what Fabric names differently: its
precision attribute is ``precision``, its hooks are ``setup_module``/``module_sharded_context``
/``_setup_distributed``/``_initialize_engine``, its launcher class is its own, and its FSDP
checkpoints gather full state dicts in ``save_checkpoint``/``load_checkpoint`` themselves.

Checkpoints need nothing here: Fabric's default ``TorchCheckpointIO`` loads every tensor onto
CPU (its ``map_location`` keeps the CPU storage torch deserialised) and ``load_state_dict``
copies it to the device, so ``fabric.load`` already reads checkpoints written on devices this
machine does not have (pinned by ``tests/test_fabric_checks.py``).
"""

from __future__ import annotations

import functools

from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from lightning.fabric.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.checkpoint import FabricAtomicSaveMixin
from lightning_anyaccel.sharded_precision import AnyFabricFSDPPrecision
from lightning_anyaccel.strategies.common import (
    AnyDistributedMixin,
    FabricParameterMovesMixin,
    LazyDeviceMixin,
    SafeLaunchMixin,
)
from lightning_anyaccel.strategies.sharding import (
    AnyDeepSpeedMixin,
    AnyFSDPMixin,
    AnyModelParallelMixin,
    ShardingNotSupportedError,
)


class AnySingleDeviceStrategy(FabricParameterMovesMixin, LazyDeviceMixin, SingleDeviceStrategy):
    """Fabric on one device of the accelerator's type (Fabric alone would pick ``"cpu"``).

    Example:
        >>> from lightning import Fabric
        >>> from lightning_anyaccel.fabric import AnyAccelerator
        >>> fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=AnySingleDeviceStrategy(), devices=1)
        >>> fabric.device
        device(type='cpu')
    """

    strategy_name = "any_single"
    _precision_attr = "precision"


_MultiProcessingLauncher = _lightning.private(
    "lightning.fabric.strategies.launchers.multiprocessing", "_MultiProcessingLauncher"
)


class AnyMultiProcessingLauncher(SafeLaunchMixin, _MultiProcessingLauncher):
    """Fabric's spawn/fork launcher, with the fork and shared-memory fixes of :class:`SafeLaunchMixin`."""


class AnyDDPStrategy(FabricParameterMovesMixin, AnyDistributedMixin, DDPStrategy):
    """Fabric DDP with the backend, streams, barrier and fork checks of the accelerator's device type.

    Takes every argument of Lightning's Fabric ``DDPStrategy``; ``process_group_backend=None`` chooses
    from the device table, ``start_method`` is ``"popen"`` (default), ``"spawn"`` or ``"fork"``.
    """

    strategy_name = "any_ddp"
    _precision_attr = "precision"
    _set_world_ranks_attr = "_set_world_ranks"
    _launcher_class = AnyMultiProcessingLauncher

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        device_ids = self._determine_ddp_device_ids()
        return self._wrap_ddp(module, device_ids)


class AnyFSDPStrategy(FabricAtomicSaveMixin, AnyFSDPMixin, FSDPStrategy):
    """Fabric's ``FSDPStrategy`` (FSDP1) on the accelerator's device type.

    Takes every argument of Fabric's ``FSDPStrategy`` (``sharding_strategy``, ``state_dict_type``
    ``"sharded"``/``"full"``, ``auto_wrap_policy``, ``cpu_offload``, ``device_mesh``, ...), plus
    ``state_dict_offload`` (see :class:`~lightning_anyaccel.strategies.sharding.AnyFSDPMixin`).
    Registered as ``any_fsdp`` and ``any_fsdp_cpu_offload``; mixed precision uses
    :class:`~lightning_anyaccel.sharded_precision.AnyFabricFSDPPrecision`.

    Example:
        >>> from lightning import Fabric
        >>> import lightning_anyaccel
        >>> fabric = Fabric(accelerator="any", strategy="any_fsdp", devices=2, precision="bf16-mixed")
        >>> type(fabric.strategy).__name__, fabric.strategy.precision.device
        ('AnyFSDPStrategy', 'cpu')
    """

    _precision_attr = "precision"
    _set_world_ranks_attr = "_set_world_ranks"
    _fsdp_kwargs_attr = "_fsdp_kwargs"
    _lightning_fsdp_precision = FSDPPrecision
    _any_fsdp_precision = AnyFabricFSDPPrecision

    @override
    def setup_module(self, module: Module) -> Module:
        """Wrap ``module`` in FSDP with ``device_id=root_device`` (Lightning passes its index, ``None`` on CPU)."""
        return self._wrap_fsdp(module, functools.partial(super().setup_module, module))

    @override
    def module_sharded_context(self) -> AbstractContextManager:
        return self._fsdp_enable_wrap()

    @contextmanager
    def _lightning_full_state_dict(self) -> Generator[None, None, None]:
        """Make Lightning's checkpoint code gather full state dicts through :meth:`_full_state_dict_context`.

        Fabric's ``save_checkpoint``/``load_checkpoint`` call a module-level helper that always
        offloads to CPU (a crash when FSDP runs on CPU). For the duration of the call, that helper
        (in both modules that use it) is replaced by one that follows :attr:`state_dict_offload`.
        """
        if self.state_dict_offload:
            yield
            return

        def helper(module: Module, world_size: int = 1, rank0_only: bool = True) -> AbstractContextManager:
            return self._full_state_dict_context(module, rank0_only)

        modules = [
            self._front_end.module(name)
            for name in ("lightning.fabric.strategies.fsdp", "lightning.fabric.strategies.model_parallel")
        ]
        originals = [_lightning.private(m, "_get_full_state_dict_context", self._front_end) for m in
                     ("lightning.fabric.strategies.fsdp", "lightning.fabric.strategies.model_parallel")]
        for module in modules:
            module._get_full_state_dict_context = helper
        try:
            yield
        finally:
            for module, original in zip(modules, originals):
                module._get_full_state_dict_context = original

    @override
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Fabric's save; a full state dict is gathered without offloading where the device table says so."""
        with self._lightning_full_state_dict():
            super().save_checkpoint(*args, **kwargs)

    @override
    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Fabric's load; a full checkpoint is loaded in the same full-state-dict mode as it was saved."""
        with self._lightning_full_state_dict():
            return super().load_checkpoint(*args, **kwargs)


def fully_shard_data_parallel(module: Module, device_mesh: Any) -> Module:
    """The default ``parallelize_fn`` of Fabric's :class:`AnyModelParallelStrategy`: FSDP2 over the whole module.

    ``fully_shard`` on ``module`` over the mesh's ``"data_parallel"`` dimension: parameters,
    gradients and optimizer state are split across the processes, and gathered all at once in
    forward and backward. To gather one block at a time, pass your own ``parallelize_fn`` that
    calls ``fully_shard`` on each block first.
    """
    from torch.distributed.fsdp import fully_shard

    return fully_shard(module, mesh=device_mesh["data_parallel"])


class AnyModelParallelStrategy(FabricAtomicSaveMixin, AnyModelParallelMixin, ModelParallelStrategy):
    """Fabric's ``ModelParallelStrategy`` (FSDP2 + tensor parallel) on the accelerator's device type.

    Args:
        parallelize_fn: ``fn(module, device_mesh) -> module`` applying ``fully_shard`` / tensor
            parallelism (as for Lightning's strategy). ``None`` (default) is
            :func:`fully_shard_data_parallel`, which only makes sense with ``tensor_parallel_size=1``
            (the ``any_fsdp2`` name).
        *args, **kwargs: the other arguments of Fabric's ``ModelParallelStrategy``
            (``data_parallel_size``, ``tensor_parallel_size``, ``save_distributed_checkpoint``, ...).

    Raises:
        ShardingNotSupportedError: no ``parallelize_fn`` with tensor parallelism (``any_model_parallel``).
    """

    _precision_attr = "precision"
    _set_world_ranks_attr = "_set_world_ranks"

    def __init__(self, parallelize_fn: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(parallelize_fn or fully_shard_data_parallel, *args, **kwargs)
        self._default_parallelize = parallelize_fn is None

    @override
    def _validate_device_setup(self) -> None:
        super()._validate_device_setup()
        if self._default_parallelize and self._tensor_parallel_size != 1:
            raise ShardingNotSupportedError(
                f"{type(self).__name__}(tensor_parallel_size={self._tensor_parallel_size!r}) needs your"
                " parallelize_fn: Fabric cannot guess a tensor-parallel plan. Pass"
                " AnyModelParallelStrategy(parallelize_fn=...), or use strategy='any_fsdp2' (FSDP2 only)."
            )



class AnyDeepSpeedStrategy(FabricAtomicSaveMixin, AnyDeepSpeedMixin, DeepSpeedStrategy):
    """Fabric's ``DeepSpeedStrategy`` (ZeRO 1/2/3, offload) on the device types DeepSpeed knows.

    Takes every argument of Fabric's ``DeepSpeedStrategy``. Registered as ``any_deepspeed``,
    ``any_deepspeed_stage_1`` ... ``any_deepspeed_stage_3_offload`` (see
    :data:`~lightning_anyaccel.strategies.sharding.DEEPSPEED_NAMES`).

    Gradients are not clipped unless the config says so (``"gradient_clipping"``), as with the
    Trainer's strategy: Fabric's leaves the key unset, and DeepSpeed (0.19.8, whose default is
    1.0) then clips the gradient norm to 1 (measured: updates differ from DDP's from the first step).

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    _precision_attr = "precision"
    _set_world_ranks_attr = "_set_world_ranks"
    _lightning_setup_skips = "lightning.fabric.strategies.DeepSpeedStrategy"

    @override
    def _setup_distributed(self) -> None:
        self._setup_deepspeed_distributed()
        self.config.setdefault("gradient_clipping", 0.0)  # what the Trainer's strategy does without gradient_clip_val
        if not self._config_initialized:
            self._format_config()
            self._config_initialized = True

    @override
    def _initialize_engine(
        self, model: Module, optimizer: Optimizer | None = None, scheduler: Any = None
    ) -> tuple[Any, Optimizer, Any]:
        """``deepspeed.initialize`` with :attr:`device_rank` (Lightning passes ``None`` on CPU)."""
        engine, deepspeed_optimizer, _, deepspeed_scheduler = self._deepspeed_initialize(model, optimizer, scheduler)
        return engine, deepspeed_optimizer, deepspeed_scheduler


__all__ = [
    "AnyDDPStrategy",
    "AnyDeepSpeedStrategy",
    "AnyFSDPStrategy",
    "AnyModelParallelStrategy",
    "AnyMultiProcessingLauncher",
    "AnySingleDeviceStrategy",
    "fully_shard_data_parallel",
]
