"""``AnyDeepSpeedStrategy``: DeepSpeed ZeRO stage 1/2/3 (and offload) on the devices DeepSpeed knows.

DeepSpeed has its own accelerator layer (``deepspeed.accelerator``) with back ends for the
device types the device table lists in ``deepspeed_accelerator`` (cpu, cuda, xpu, hpu, npu).
Lightning's ``DeepSpeedStrategy`` runs only with its ``CUDAAccelerator``; this subclass

- replaces the CUDA check with the device table, and points DeepSpeed at the strategy's device
  type through ``DS_ACCELERATOR`` before DeepSpeed picks one itself;
- validates device indices only for devices that have them (CPU devices have none, and
  Lightning's check would fail);
- gives DeepSpeed a device rank on every device (Lightning passes ``root_device.index``, which is
  ``None`` on CPU and makes DeepSpeed fail with a ``TypeError``): the index, else the local rank,
  for the training engine and for the inference engine of ``validate``/``test``/``predict``;
- takes the collective backend from the device table, like every strategy of the package.

DeepSpeed is an optional extra: ``pip install lightning-anyaccel[deepspeed]``. On CPU without
oneCCL it uses gloo; it compiles its ops the first time they are used (cache them with
``TORCH_EXTENSIONS_DIR``). A build lock left there by a killed build is waited on for at most
10 minutes and then reported with its path (:mod:`lightning_anyaccel.build_locks`); torch alone
would wait forever.

Registered names: ``any_deepspeed``, ``any_deepspeed_stage_1``, ``any_deepspeed_stage_2``,
``any_deepspeed_stage_2_offload``, ``any_deepspeed_stage_3``, ``any_deepspeed_stage_3_offload``
(the same for Fabric; the logic is :class:`~lightning_anyaccel.strategies.sharding.AnyDeepSpeedMixin`).

Example:
    >>> DEEPSPEED_NAMES["any_deepspeed_stage_3_offload"]
    {'stage': 3, 'offload_optimizer': True, 'offload_parameters': True}
    >>> deepspeed_device_types()
    ['cpu', 'cuda', 'hpu', 'npu', 'xpu']
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel.checkpoint import AtomicSaveMixin
from lightning_anyaccel.strategies.sharding import (
    DEEPSPEED_NAMES,
    AnyDeepSpeedMixin,
    DeepSpeedNotInstalledError,
    deepspeed_device_types,
)


class AnyDeepSpeedStrategy(AtomicSaveMixin, AnyDeepSpeedMixin, DeepSpeedStrategy):
    """DeepSpeed (ZeRO 1/2/3, optimizer/parameter offload) on the accelerator's device type.

    Takes every argument of Lightning's ``DeepSpeedStrategy`` (``stage``, ``offload_optimizer``,
    ``offload_parameters``, ``config``, ...). ``process_group_backend=None`` takes the device
    table's backend. The device logic is :class:`~lightning_anyaccel.strategies.sharding.AnyDeepSpeedMixin`,
    shared with Fabric.

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    @override
    def setup_distributed(self) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group."""
        self._setup_deepspeed_distributed()

    @override
    def _setup_model_and_optimizer(
        self, model: Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[Any, Optimizer]:
        """``deepspeed.initialize`` with :attr:`device_rank` (Lightning passes ``None`` on CPU)."""
        engine, deepspeed_optimizer, _, _ = self._deepspeed_initialize(model, optimizer, lr_scheduler)
        return engine, deepspeed_optimizer

    @override
    def _initialize_deepspeed_inference(self, model: Module) -> None:
        """The engine for ``validate``/``test``/``predict`` outside ``fit``, with :attr:`device_rank`.

        Lightning's builds the same inference config but passes ``root_device.index`` (``None`` on
        CPU, and DeepSpeed fails with a ``TypeError``), like its training engine.
        """
        assert isinstance(self.config, dict)
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}  # DeepSpeed's throughput timers
        inference_config.update({key: self.config[key] for key in ("fp16", "bf16") if key in self.config})
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        remove_module_hooks(model)  # the hooks of a previous engine
        self.model = self._deepspeed_initialize(model, None, config=inference_config, model_parameters=[])[0]

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._barrier()


__all__ = ["AnyDeepSpeedStrategy", "DEEPSPEED_NAMES", "DeepSpeedNotInstalledError", "deepspeed_device_types"]
