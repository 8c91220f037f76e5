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

import functools
import inspect
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
    ShardingNotSupportedError,
    deepspeed_device_types,
)


#: Keys of DeepSpeed's inference configuration that its training configuration has too
#: (``deepspeed/runtime/constants.py``): in ``config=`` they do not ask for the inference engine.
_TRAINING_KEYS = frozenset({"checkpoint"})


@functools.cache
def inference_config_keys() -> frozenset[str]:
    """The keys of DeepSpeed's inference configuration (``deepspeed.init_inference``), asked from DeepSpeed.

    >>> {"tensor_parallel", "dtype", "replace_with_kernel_inject"} <= inference_config_keys()
    True
    """
    import deepspeed

    return frozenset(deepspeed.default_inference_config())


class AnyDeepSpeedStrategy(AtomicSaveMixin, AnyDeepSpeedMixin, DeepSpeedStrategy):
    """DeepSpeed (ZeRO 1/2/3, optimizer/parameter offload) on the accelerator's device type.

    Takes every argument of Lightning's ``DeepSpeedStrategy`` (``stage``, ``offload_optimizer``,
    ``offload_parameters``, ``config``, ...). ``process_group_backend=None`` takes the device
    table's backend. The device logic is :class:`~lightning_anyaccel.strategies.sharding.AnyDeepSpeedMixin`,
    shared with Fabric.

    DeepSpeed *inference* arguments, as lightning-habana's ``HPUDeepSpeedStrategy`` takes them
    (``tensor_parallel={"tp_size": 2}``, ``dtype=torch.float``, ``replace_with_kernel_inject``,
    ``injection_policy``, ``replace_method``, ``enable_cuda_graph``, ... every key of
    ``deepspeed.default_inference_config()``), as keyword arguments or as keys of ``config``,
    make ``validate``/``test``/``predict`` build the engine with ``deepspeed.init_inference``
    (kernel injection, tensor parallelism) instead of ZeRO's. Those DeepSpeed can not do on the
    device are refused when the process starts (:meth:`_check_inference_support`).

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
        TypeError: a keyword that is neither Lightning's nor DeepSpeed's inference configuration.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        lightning_names = set(inspect.signature(DeepSpeedStrategy.__init__).parameters) | {"timeout"}
        inference = {key: kwargs.pop(key) for key in list(kwargs) if key not in lightning_names}
        super().__init__(*args, **kwargs)
        known = inference_config_keys()
        unknown = sorted(set(inference) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s) {unknown}: neither Lightning's"
                " DeepSpeedStrategy nor DeepSpeed's inference configuration (deepspeed.init_inference) takes them."
                f" Inference keys: {', '.join(sorted(known))}."
            )
        assert isinstance(self.config, dict)
        from_config = {key: self.config[key] for key in known - _TRAINING_KEYS if key in self.config}
        #: DeepSpeed inference settings (from ``config`` and keywords; keywords win), ``{}`` for ZeRO's engine.
        self.inference_kwargs: dict[str, Any] = {**from_config, **inference}

    @override
    def _finish_setup(self) -> None:
        """Also refuse inference settings DeepSpeed can not run on this device (DeepSpeed has chosen it now)."""
        super()._finish_setup()
        self._check_inference_support()

    def _check_inference_support(self) -> None:
        """Refuse kernel injection where DeepSpeed has no inference kernels for the device (it has them for cuda, hpu).

        Raises:
            ShardingNotSupportedError: ``replace_with_kernel_inject=True`` without DeepSpeed's
                ``InferenceBuilder`` for the device, naming the setting that runs (automatic
                tensor parallelism, ``replace_with_kernel_inject=False``).
        """
        if not self.inference_kwargs.get("replace_with_kernel_inject"):
            return
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("InferenceBuilder")  # hpu, cuda: yes; cpu: NotImplementedBuilder
        if builder is None or type(builder).__name__ == "NotImplementedBuilder" or not builder.is_compatible(False):
            raise ShardingNotSupportedError(
                f"replace_with_kernel_inject=True needs DeepSpeed's inference kernels, which DeepSpeed does not have"
                f" for {self.device_type!r} (its {get_accelerator().device_name()!r} accelerator). Pass"
                " replace_with_kernel_inject=False: DeepSpeed then splits the model's linear layers across"
                " tensor_parallel={'tp_size': N} ranks without custom kernels (automatic tensor parallelism)."
            )

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
        """The engine for ``validate``/``test``/``predict`` outside ``fit``.

        With :attr:`inference_kwargs`: ``deepspeed.init_inference`` with them (what lightning-habana
        does). Otherwise ZeRO's engine, as Lightning builds it, but with :attr:`device_rank`
        (Lightning passes ``root_device.index``: ``None`` on CPU, and DeepSpeed fails with a ``TypeError``).
        """
        assert isinstance(self.config, dict)
        remove_module_hooks(model)  # the hooks of a previous engine
        if self.inference_kwargs:
            import deepspeed

            self.model = deepspeed.init_inference(model, config=dict(self.inference_kwargs))
            return
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}  # DeepSpeed's throughput timers
        inference_config.update({key: self.config[key] for key in ("fp16", "bf16") if key in self.config})
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        self.model = self._deepspeed_initialize(model, None, config=inference_config, model_parameters=[])[0]

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._barrier()


__all__ = ["AnyDeepSpeedStrategy", "DEEPSPEED_NAMES", "DeepSpeedNotInstalledError", "deepspeed_device_types",
           "inference_config_keys"]
