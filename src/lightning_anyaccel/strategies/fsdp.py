"""``AnyFSDPStrategy``: Lightning's ``FSDPStrategy`` interface (FSDP1) on any device type.

What Lightning's ``FSDPStrategy`` does that only works on CUDA, and what this subclass does instead:

- the connector refuses FSDP unless the accelerator is CUDA (audit row 7): the check is
  ``type(strategy) is FSDPStrategy`` and the registered names, so this subclass and its own
  names (``any_fsdp``, ``any_fsdp_cpu_offload``) pass;
- ``FullyShardedDataParallel(device_id=root_device.index)``: ``None`` on CPU, which FSDP then
  resolves to "the current accelerator" and fails; here ``device_id`` is the ``torch.device``;
- a ``device_mesh=(replicas, shards)`` tuple becomes ``init_device_mesh("cuda", ...)`` (row 25);
  here the mesh is built on the strategy's device type;
- ``FSDPPrecision`` autocasts on ``"cuda"`` with a CUDA ``ShardedGradScaler`` (row 9); here
  :class:`~lightning_anyaccel.sharded_precision.AnyFSDPPrecision` on the device type;
- full-state-dict checkpoints gather with ``offload_to_cpu=True``, which segfaults when FSDP
  runs on CPU; here offloading follows the device table (``fsdp_full_state_offload``).

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_fsdp", devices=2, logger=False)
    >>> type(trainer.strategy).__name__
    'AnyFSDPStrategy'
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lightning.fabric.strategies.fsdp import _move_torchmetrics_to_device, _setup_activation_checkpointing
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel.precision import align_precision_plugin
from lightning_anyaccel.sharded_precision import AnyFSDPPrecision
from lightning_anyaccel.strategies.common import AnyShardedMixin, ShardingNotSupportedError


class AnyFSDPStrategy(AnyShardedMixin, FSDPStrategy):
    """Fully Sharded Data Parallel (``torch.distributed.fsdp``) on the accelerator's device type.

    Takes every argument of Lightning's ``FSDPStrategy`` (``sharding_strategy``, ``state_dict_type``
    ``"full"``/``"sharded"``, ``auto_wrap_policy``, ``cpu_offload``, ``device_mesh``, ...), plus:

    Args:
        state_dict_offload: move gathered full-state-dict tensors to CPU while saving
            (``state_dict_type="full"``). ``None`` (default) takes the device table's
            ``fsdp_full_state_offload`` (on except on CPU, where it crashes torch).

    Raises:
        ShardingNotSupportedError: ``state_dict_offload=True`` on a device where torch cannot do
            it, or a device without collectives (``mps``).
    """

    strategy_name = "any_fsdp"
    _sharding_name = "FSDP"

    def __init__(self, *args: Any, state_dict_offload: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state_dict_offload = state_dict_offload

    # ----- checks and device alignment ---------------------------------------------------------

    @override
    def _validate_device_setup(self) -> None:
        super()._validate_device_setup()
        if self._state_dict_offload and self._state_dict_type == "full" and not self._spec.fsdp_full_state_offload:
            raise ShardingNotSupportedError(
                f"AnyFSDPStrategy(state_dict_offload=True, state_dict_type='full') on {self._spec.name}: torch's"
                " FSDP frees storage it still reads when it 'offloads' tensors that already live on CPU, and the"
                " process crashes (Lightning-AI/pytorch-lightning#21804). Leave state_dict_offload unset, or use"
                " state_dict_type='sharded'."
            )

    @override
    def _align_precision(self) -> None:
        """Replace Lightning's CUDA-bound ``FSDPPrecision`` with :class:`AnyFSDPPrecision` on our device."""
        plugin = self._precision_plugin
        if isinstance(plugin, FSDPPrecision) and not isinstance(plugin, AnyFSDPPrecision):
            plugin = AnyFSDPPrecision(plugin.precision, device=self.device_type)
        if plugin is not None:
            self.precision_plugin = align_precision_plugin(plugin, self.device_type)

    # ----- process group, mesh, wrapping -------------------------------------------------------

    @override
    def setup_environment(self) -> None:
        self._validate_device_setup()
        mesh_shape = self.kwargs.get("device_mesh")
        if isinstance(mesh_shape, tuple):
            del self.kwargs["device_mesh"]  # Lightning would build it on "cuda"
        super().setup_environment()
        self._destroy_at_exit()
        if isinstance(mesh_shape, tuple):
            self.kwargs["device_mesh"] = self._init_device_mesh(mesh_shape, ("replicate", "shard"))

    @override
    def _get_process_group_backend(self) -> str:
        return self._resolve_backend()

    def _fsdp_kwargs(self) -> dict[str, Any]:
        """Arguments for every ``FullyShardedDataParallel`` this strategy builds (``device_id`` is the device)."""
        return dict(
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self.kwargs,
        )

    @override
    def _setup_model(self, model: Module) -> Module:
        """Wrap ``model`` in FSDP with ``device_id=root_device`` (Lightning passes its index, ``None`` on CPU)."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(module, FullyShardedDataParallel) for module in model.modules()):
            return super()._setup_model(model)  # wrapped by the user in `configure_model`
        wrapped = FullyShardedDataParallel(module=model, **self._fsdp_kwargs())
        _move_torchmetrics_to_device(wrapped, self.root_device)
        _setup_activation_checkpointing(wrapped, self._activation_checkpointing_kwargs)
        return wrapped

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        from torch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        with enable_wrap(wrapper_cls=FullyShardedDataParallel, **self._fsdp_kwargs()):
            yield

    @override
    def barrier(self, name: str | None = None) -> None:
        self._barrier()

    # ----- checkpoints -------------------------------------------------------------------------

    @property
    def state_dict_offload(self) -> bool:
        """Whether full state dicts are gathered with ``offload_to_cpu`` (the table decides unless given)."""
        if self._state_dict_offload is not None:
            return self._state_dict_offload
        return self._spec.fsdp_full_state_offload

    def _full_state_dict_context(self, rank0_only: bool = True) -> AbstractContextManager:
        """FSDP's full-state-dict mode, offloading to CPU only where the device table allows it."""
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        assert self.model is not None
        offload = self.state_dict_offload
        return FSDP.state_dict_type(
            module=self.model,
            state_dict_type=StateDictType.FULL_STATE_DICT,
            state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
            optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        )

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with self._full_state_dict_context():
            return self.model.state_dict()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        assert self.model is not None
        with self._full_state_dict_context():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard (parameter-id keyed) format, as Lightning writes it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
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


__all__ = ["AnyFSDPStrategy"]
