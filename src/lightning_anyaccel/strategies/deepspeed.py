"""``AnyDeepSpeedStrategy``: DeepSpeed ZeRO stage 1/2/3 (and offload) on the devices DeepSpeed knows.

DeepSpeed has its own accelerator layer (``deepspeed.accelerator``) with back ends for the
device types the device table lists in ``deepspeed_accelerator`` (cpu, cuda, xpu, hpu, npu).
Lightning's ``DeepSpeedStrategy`` runs only with its ``CUDAAccelerator``; this subclass

- replaces the CUDA check with the device table, and points DeepSpeed at the strategy's device
  type through ``DS_ACCELERATOR`` before DeepSpeed picks one itself;
- validates device indices only for devices that have them (CPU devices have none, and
  Lightning's check would fail);
- gives DeepSpeed a device rank on every device (Lightning passes ``root_device.index``, which is
  ``None`` on CPU and makes DeepSpeed fail with a ``TypeError``): the index, else the local rank;
- takes the collective backend from the device table, like every strategy of the package.

DeepSpeed is an optional extra: ``pip install lightning-anyaccel[deepspeed]``. On CPU without
oneCCL it uses gloo; it compiles its ops the first time they are used (cache them with
``TORCH_EXTENSIONS_DIR``).

Registered names: ``any_deepspeed``, ``any_deepspeed_stage_1``, ``any_deepspeed_stage_2``,
``any_deepspeed_stage_2_offload``, ``any_deepspeed_stage_3``, ``any_deepspeed_stage_3_offload``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import Any

from lightning.fabric.strategies.deepspeed import _validate_device_index_selection
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DeepSpeedStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel.devices import DEVICE_TABLE
from lightning_anyaccel.strategies.common import AnyShardedMixin, ShardingNotSupportedError

#: Registered name -> arguments.
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


class AnyDeepSpeedStrategy(AnyShardedMixin, DeepSpeedStrategy):
    """DeepSpeed (ZeRO 1/2/3, optimizer/parameter offload) on the accelerator's device type.

    Takes every argument of Lightning's ``DeepSpeedStrategy`` (``stage``, ``offload_optimizer``,
    ``offload_parameters``, ``config``, ...). ``process_group_backend=None`` takes the device
    table's backend.

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    strategy_name = "any_deepspeed"
    _sharding_name = "DeepSpeed"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise DeepSpeedNotInstalledError(
                "AnyDeepSpeedStrategy needs DeepSpeed: `pip install lightning-anyaccel[deepspeed]`"
                " (on machines without a CUDA toolkit: `DS_BUILD_OPS=0 pip install deepspeed`)."
                " Or use strategy='any_fsdp', which needs nothing beyond torch."
            )
        super().__init__(*args, **kwargs)

    # ----- device checks -----------------------------------------------------------------------

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

    # ----- distributed setup -------------------------------------------------------------------

    @override
    def setup_environment(self) -> None:
        """Lightning's setup without its ``CUDAAccelerator``-only check, then DeepSpeed's accelerator check."""
        self._validate_device_setup()
        super(DeepSpeedStrategy, self).setup_environment()
        from deepspeed.accelerator import get_accelerator

        active = get_accelerator().device_name()
        if active != self.deepspeed_accelerator:
            raise ShardingNotSupportedError(
                f"DeepSpeed already chose its {active!r} accelerator in this process, but the strategy trains on"
                f" {self.device_type!r}. Set DS_ACCELERATOR={self.deepspeed_accelerator} before importing deepspeed."
            )

    @override
    def setup_distributed(self) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group."""
        assert self.parallel_devices is not None
        if self._process_group_device() is not None:
            _validate_device_index_selection(self.parallel_devices)
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()
        self._destroy_at_exit()

    @override
    def _get_process_group_backend(self) -> str:
        return self._resolve_backend()

    @property
    def device_rank(self) -> int:
        """The device DeepSpeed binds this process to: the device index, else the local rank (CPU)."""
        index = self.root_device.index
        return index if index is not None else self.local_rank

    @override
    def _setup_model_and_optimizer(
        self, model: Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[Any, Optimizer]:
        """``deepspeed.initialize`` with :attr:`device_rank` (Lightning passes ``None`` on CPU)."""
        import deepspeed

        engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.device_rank),
            config=self.config,
            model=model,
            model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, deepspeed_optimizer

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._barrier()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, arguments in DEEPSPEED_NAMES.items():
            strategy_registry.register(
                name, cls, description=f"DeepSpeed on the accelerator's device type {arguments}", override=True,
                **arguments,
            )


__all__ = ["AnyDeepSpeedStrategy", "DEEPSPEED_NAMES", "DeepSpeedNotInstalledError", "deepspeed_device_types"]
