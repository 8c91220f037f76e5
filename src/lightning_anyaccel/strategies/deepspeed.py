"""The DeepSpeed family: ZeRO stage 1/2/3 (and offload) on the devices DeepSpeed knows, for the Trainer and for Fabric.

DeepSpeed has its own accelerator layer (``deepspeed.accelerator``) with back ends for some device
types (cpu, cuda, xpu, hpu, npu, sdaa, mlu, ...); where it runs is DeepSpeed's own list and probe
(:func:`~lightning_anyaccel.strategies.support.deepspeed_support`).
Lightning's ``DeepSpeedStrategy`` runs only with its ``CUDAAccelerator``; :class:`AnyDeepSpeedMixin`

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
10 minutes and then reported with its path (:mod:`lightning_anyaccel.cluster.build_locks`); torch alone
would wait forever.

Registered names: ``any_deepspeed``, ``any_deepspeed_stage_1``, ``any_deepspeed_stage_2``,
``any_deepspeed_stage_2_offload``, ``any_deepspeed_stage_3``, ``any_deepspeed_stage_3_offload``
(the same for Fabric). The Trainer's class is :class:`AnyDeepSpeedStrategy`, Fabric's
``lightning_anyaccel.fabric.AnyDeepSpeedStrategy`` (:class:`FabricDeepSpeedStrategy` here).

The family's own setup steps are in :mod:`~lightning_anyaccel.strategies.deepspeed_checks`.

Example:
    >>> DEEPSPEED_NAMES["any_deepspeed_stage_3_offload"]
    {'stage': 3, 'offload_optimizer': True, 'offload_parameters': True}
    >>> [step.name for step in TRAINER_SETUP if step not in SETUP]
    ['check_inference_support']
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
from datetime import timedelta
from typing import Any, ClassVar

import torch
from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeed
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.cluster import build_locks
from lightning_anyaccel.front_ends import FabricSide
from lightning_anyaccel.strategies.atomic_save import AtomicSaveMixin, FabricAtomicSaveMixin
from lightning_anyaccel.strategies.base import FabricProgressMixin, Registered, fabric_class
from lightning_anyaccel.strategies.deepspeed_checks import (
    check_active_deepspeed_accelerator,
    check_deepspeed_support,
    check_inference_support,
    inference_config_keys,
    select_deepspeed_accelerator,
)
from lightning_anyaccel.strategies.errors import DeepSpeedNotInstalledError, ShardingNotSupportedError
from lightning_anyaccel.strategies.sharded import AnyShardedMixin
from lightning_anyaccel.strategies.steps import (
    AFTER_JOIN,
    BEFORE_JOIN,
    Setup,
    before_launch,
    check_collectives,
    in_worker,
    launch_checks,
    lightning_setup_within_deadline,
)
from lightning_anyaccel.strategies.support import deepspeed_support

#: Registered DeepSpeed name -> arguments (the same names for the Trainer and for Fabric).
DEEPSPEED_NAMES: dict[str, dict[str, Any]] = {
    "any_deepspeed": {},
    "any_deepspeed_stage_1": {"stage": 1},
    "any_deepspeed_stage_2": {"stage": 2},
    "any_deepspeed_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "any_deepspeed_stage_3": {"stage": 3},
    "any_deepspeed_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
}
#: The names the family registers with each front end (those of :data:`DEEPSPEED_NAMES`).
NAMES: dict[str, Registered] = {
    name: Registered(f"DeepSpeed on the accelerator's device type {arguments}", arguments)
    for name, arguments in DEEPSPEED_NAMES.items()
}

#: Keys of DeepSpeed's inference configuration that its training configuration has too
#: (``deepspeed/runtime/constants.py``): in ``config=`` they do not ask for the inference engine.
_TRAINING_KEYS = frozenset({"checkpoint"})


#: What a DeepSpeed strategy does at setup, in order (launching process: the ``before_launch`` steps).
#: Lightning's setup runs past ``DeepSpeedStrategy``'s own (:meth:`AnyDeepSpeedMixin.lightning_setup_environment`).
SETUP: Setup = (
    before_launch(select_deepspeed_accelerator),
    before_launch(check_deepspeed_support),
    before_launch(check_collectives),
    *launch_checks(),
    *BEFORE_JOIN,
    in_worker(lightning_setup_within_deadline),
    *AFTER_JOIN,
    in_worker(check_active_deepspeed_accelerator),
)

#: The Trainer's: the same, and the inference settings checked once DeepSpeed has chosen its accelerator.
TRAINER_SETUP: Setup = (*SETUP, in_worker(check_inference_support))


def bound_deepspeed_groups(timeout: timedelta) -> bool:
    """Make the process groups DeepSpeed creates itself time out after ``timeout`` too.

    ``deepspeed.init_distributed(timeout=...)`` bounds only the default group. ZeRO then
    all-reduces over groups it makes with ``torch.distributed.new_group(ranks)`` (a clone of
    the world group, data-parallel groups), which get torch's default: 30 minutes on gloo.
    A frozen rank then holds the job for half an hour whatever the strategy's ``timeout``.
    Call after DeepSpeed's ``init_distributed``; returns whether DeepSpeed's backend was patched.
    """
    return _lightning.bound_deepspeed_new_group(timeout)

class AnyDeepSpeedMixin(AnyShardedMixin):
    """DeepSpeed on the device types DeepSpeed's accelerator layer knows, for the Trainer and for Fabric.

    Mixed in before either front end's ``DeepSpeedStrategy``. Its setup is :data:`SETUP`; both
    front ends start the process group with :meth:`_setup_deepspeed_distributed` and build the
    engine with :meth:`_deepspeed_initialize`.

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    strategy_name: ClassVar[str] = "any_deepspeed"
    setup_steps: ClassVar[Setup] = SETUP
    sharding_name = "DeepSpeed"
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
        support = deepspeed_support(self.spec, probe=False)
        if not support.supported:
            raise ShardingNotSupportedError(support.reason)
        return self.device_type  # DeepSpeed names its accelerators as torch names the device types

    @override
    def lightning_setup_environment(self) -> None:
        """Lightning's ``setup_environment`` past ``DeepSpeedStrategy``'s own, which refuses every accelerator but CUDA.

        The process group starts in the front end's hook (:meth:`_setup_deepspeed_distributed`).
        """
        lightning_deepspeed: Any = self.side.deepspeed_strategy_class()
        super(lightning_deepspeed, self).setup_environment()

    def _setup_deepspeed_distributed(self) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group.

        Both front ends call this from their process-group hook (Trainer: ``setup_distributed``;
        Fabric: ``_setup_distributed``), inside the step
        :func:`~lightning_anyaccel.strategies.steps.lightning_setup_within_deadline`.
        """
        parallel_devices = self.parallel_devices
        assert parallel_devices is not None
        if self._process_group_device() is not None and self.spec.process_device_env is None:  # Gaudi: all hpu:0
            _lightning.validate_device_index_selection(parallel_devices)
        reset_seed()
        self.side.set_world_ranks(self)
        build_locks.wait_for_build_locks()  # DeepSpeed may compile an op here; torch would wait on a stale lock forever
        _lightning.init_deepspeed_distributed(self)
        bound_deepspeed_groups(_lightning.timeout_of(self))  # DeepSpeed's own groups honour the timeout too

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


class AnyDeepSpeedStrategy(AtomicSaveMixin, AnyDeepSpeedMixin, DeepSpeedStrategy):
    """DeepSpeed (ZeRO 1/2/3, optimizer/parameter offload) on the accelerator's device type (Trainer).

    Takes every argument of Lightning's ``DeepSpeedStrategy`` (``stage``, ``offload_optimizer``,
    ``offload_parameters``, ``config``, ...). ``process_group_backend=None`` takes the device
    table's backend. The device logic is :class:`AnyDeepSpeedMixin`,
    shared with Fabric.

    DeepSpeed *inference* arguments, as lightning-habana's ``HPUDeepSpeedStrategy`` takes them
    (``tensor_parallel={"tp_size": 2}``, ``dtype=torch.float``, ``replace_with_kernel_inject``,
    ``injection_policy``, ``replace_method``, ``enable_cuda_graph``, ... every key of
    ``deepspeed.default_inference_config()``), as keyword arguments or as keys of ``config``,
    make ``validate``/``test``/``predict`` build the engine with ``deepspeed.init_inference``
    (kernel injection, tensor parallelism) instead of ZeRO's. Those DeepSpeed can not do on the
    device are refused when the process starts (:func:`check_inference_support`).

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
        TypeError: a keyword that is neither Lightning's nor DeepSpeed's inference configuration.
    """

    setup_steps: ClassVar[Setup] = TRAINER_SETUP

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        lightning_names = set(inspect.signature(DeepSpeedStrategy.__init__).parameters) | {"timeout", "stall_timeout"}
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
        #: The dtype of the inference engine's weights while it is the model (``None`` otherwise).
        self._inference_input_dtype: torch.dtype | None = None

    @override
    def setup_distributed(self) -> None:
        """Check device indices only where devices have them, then start DeepSpeed's process group."""
        self._setup_deepspeed_distributed()

    @override
    def _setup_model_and_optimizer(
        self, model: Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[Any, Optimizer]:
        """``deepspeed.initialize`` with :attr:`device_rank` (Lightning passes ``None`` on CPU).

        Raises:
            MisconfigurationException: the optimizer holds no parameters: ``configure_optimizers``
                returned ``None`` (Lightning then passes a stand-in without parameters, and
                DeepSpeed's ZeRO optimizer fails with an ``IndexError``), as lightning-habana's
                ``HPUDeepSpeedStrategy`` refuses it.
        """
        if optimizer is not None and not any(group["params"] for group in optimizer.param_groups):
            raise MisconfigurationException(
                "You have specified an invalid optimizer to be run with deepspeed: it holds no parameters"
                " (`configure_optimizers` returned None?). DeepSpeed trains with an optimizer: return one from"
                " `configure_optimizers` (e.g. `torch.optim.AdamW(self.parameters())`) or name one in the DeepSpeed"
                " config's \"optimizer\" section. To run the model without training it, use trainer.validate,"
                " test or predict."
            )
        self._inference_input_dtype = None
        engine, deepspeed_optimizer, _, _ = self._deepspeed_initialize(model, optimizer, lr_scheduler)
        return engine, deepspeed_optimizer

    @override
    def _initialize_deepspeed_inference(self, model: Module) -> None:
        """The engine for ``validate``/``test``/``predict`` outside ``fit``.

        With :attr:`inference_kwargs`: ``deepspeed.init_inference`` with them (what lightning-habana
        does); it casts the weights to its ``dtype`` (DeepSpeed's default: ``float16``), and
        :meth:`batch_to_device` gives it its inputs in that dtype. Otherwise ZeRO's engine, as
        Lightning builds it, but with :attr:`device_rank` (Lightning passes ``root_device.index``:
        ``None`` on CPU, and DeepSpeed fails with a ``TypeError``).
        """
        assert isinstance(self.config, dict)
        remove_module_hooks(model)  # the hooks of a previous engine
        self._inference_input_dtype = None
        if self.inference_kwargs:
            import deepspeed

            self.model = deepspeed.init_inference(model, config=dict(self.inference_kwargs))
            # the engine converts and splits ``model`` in place: its weights are the engine's
            self._inference_input_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
            return
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}  # DeepSpeed's throughput timers
        inference_config.update({key: self.config[key] for key in ("fp16", "bf16") if key in self.config})
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        self.model = self._deepspeed_initialize(model, None, config=inference_config, model_parameters=[])[0]

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """The batch on the device; for DeepSpeed's inference engine, its floating-point tensors in the engine's dtype.

        Lightning's DeepSpeed precision converts inputs to the training precision (``bf16-mixed``:
        ``bfloat16``), while ``deepspeed.init_inference`` has cast the weights to its own ``dtype``:
        without this, the first layer fails with "input tensors must have the same dtype".
        """
        batch = super().batch_to_device(batch, device, dataloader_idx)
        dtype = self._inference_input_dtype
        if dtype is None:
            return batch
        return apply_to_collection(batch, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)


@fabric_class("AnyDeepSpeedStrategy")
class FabricDeepSpeedStrategy(FabricProgressMixin, FabricAtomicSaveMixin, AnyDeepSpeedMixin, FabricDeepSpeed):
    """Fabric's ``DeepSpeedStrategy`` (ZeRO 1/2/3, offload) on the device types DeepSpeed knows.

    Published as ``lightning_anyaccel.fabric.AnyDeepSpeedStrategy``. Takes every argument of
    Fabric's ``DeepSpeedStrategy``. Registered as ``any_deepspeed``, ``any_deepspeed_stage_1`` ...
    ``any_deepspeed_stage_3_offload`` (see :data:`DEEPSPEED_NAMES`). The setup is :data:`SETUP`.

    Gradients are not clipped unless the config says so (``"gradient_clipping"``), as with the
    Trainer's strategy: Fabric's leaves the key unset, and DeepSpeed (0.19.8, whose default is
    1.0) then clips the gradient norm to 1 (measured: updates differ from DDP's from the first step).

    Raises:
        DeepSpeedNotInstalledError: ``deepspeed`` is missing, naming the extra to install.
        ShardingNotSupportedError: DeepSpeed has no back end for the device type.
    """

    _side = FabricSide

    @override
    def _setup_distributed(self) -> None:
        self._setup_deepspeed_distributed()
        self.config.setdefault("gradient_clipping", 0.0)  # what the Trainer's strategy does without gradient_clip_val
        _lightning.format_deepspeed_config_once(self)

    @override
    def _initialize_engine(
        self, model: Module, optimizer: Optimizer | None = None, scheduler: Any = None
    ) -> tuple[Any, Optimizer, Any]:
        """``deepspeed.initialize`` with :attr:`device_rank` (Lightning passes ``None`` on CPU)."""
        engine, deepspeed_optimizer, _, deepspeed_scheduler = self._deepspeed_initialize(model, optimizer, scheduler)
        return engine, deepspeed_optimizer, deepspeed_scheduler


__all__ = ["DEEPSPEED_NAMES", "NAMES", "SETUP", "TRAINER_SETUP", "AnyDeepSpeedMixin", "AnyDeepSpeedStrategy",
           "FabricDeepSpeedStrategy"]
