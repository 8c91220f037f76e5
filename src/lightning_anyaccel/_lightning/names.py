"""Every private name of Lightning, torch, DeepSpeed and ``multiprocessing`` the package uses, with
its user, and :func:`private`, the one way to read a listed module attribute.

Part of the contract (:mod:`lightning_anyaccel._lightning`); ``tests/test_lightning_contract.py``
checks each entry on the installed versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_anyaccel._lightning.porting import LIGHTNING, Distribution

# ----- private names ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivateName:
    """A private module attribute of Lightning the package uses, and who uses it.

    ``parameters``: the leading parameter names the package passes (``None``: not called, or a class).
    """

    module: str
    name: str
    used_by: str
    parameters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PrivateAttribute:
    """A private attribute (or method) of a Lightning object the package reads, writes or overrides."""

    owner: str
    name: str
    used_by: str


#: Every private Lightning module attribute the package uses (module names as in ``lightning``).
PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName("lightning.fabric.accelerators.cpu", "_parse_cpu_cores", "AnyAccelerator.parse_devices",
                ("cpu_cores",)),
    PrivateName("lightning.fabric.strategies.launchers.multiprocessing", "_disable_module_memory_sharing",
                "process_launchers.SafeLaunchMixin._wrapping_function, AnyAccelerator.setup", ("data",)),
    PrivateName("lightning.fabric.utilities.imports", "_IS_INTERACTIVE",
                "strategies.steps.check_start_method, policy.default_strategy"),
    PrivateName("lightning.fabric.utilities.distributed", "_destroy_dist_connection",
                "strategies.steps.destroy_process_group_at_exit", ()),
    PrivateName("lightning.fabric.utilities.distributed", "_distributed_is_initialized", "AnyDistributedMixin._barrier",
                ()),
    PrivateName("lightning.fabric.strategies.deepspeed", "_validate_device_index_selection",
                "strategies.deepspeed.AnyDeepSpeedMixin._setup_deepspeed_distributed", ("parallel_devices",)),
    PrivateName("lightning.fabric.strategies.fsdp", "_move_torchmetrics_to_device",
                "strategies.fsdp.AnyFSDPMixin._wrap_fsdp",
                ("module", "device")),
    PrivateName("lightning.fabric.strategies.fsdp", "_setup_activation_checkpointing",
                "strategies.fsdp.AnyFSDPMixin._wrap_fsdp",
                ("module", "activation_checkpointing_kwargs")),
    PrivateName("lightning.fabric.strategies.fsdp", "_get_full_state_dict_context",
                "strategies.fsdp.FabricFSDPStrategy._lightning_full_state_dict",
                ("module", "world_size", "rank0_only")),
    PrivateName("lightning.fabric.strategies.model_parallel", "_get_full_state_dict_context",
                "strategies.fsdp.FabricFSDPStrategy._lightning_full_state_dict",
                ("module", "world_size", "rank0_only")),
    PrivateName("lightning.pytorch.overrides.distributed", "_register_ddp_comm_hook",
                "strategies.AnyDDPStrategy._register_ddp_hooks", ("model", "ddp_comm_state", "ddp_comm_hook",
                                                                  "ddp_comm_wrapper")),
    PrivateName("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher",
                "strategies.process_launchers.AnyMultiProcessingLauncher"),
    PrivateName("lightning.fabric.strategies.launchers.multiprocessing", "_MultiProcessingLauncher",
                "strategies.process_launchers.FabricMultiProcessingLauncher"),
    PrivateName("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector",
                "install_connector_hooks"),
    PrivateName("lightning.fabric.connector", "_Connector", "install_connector_hooks"),
    PrivateName("lightning.pytorch.trainer.setup", "_log_device_info", "install_device_info_hook", ("trainer",)),
    PrivateName("lightning.pytorch.trainer.setup", "_init_profiler", "install_profiler_hook", ("trainer", "profiler")),
    # a public function, but one the package replaces (it is no API for that): Lightning's CUDA-only OOM test
    PrivateName("lightning.pytorch.utilities.memory", "is_cuda_out_of_memory", "install_out_of_memory_hook",
                ("exception",)),
    # torch (the same module in both front ends): Inductor's registry of device code generators
    PrivateName("torch.nn.modules.batchnorm", "_BatchNorm", "sync_batchnorm.DeviceSyncBatchNorm (base class)"),
    PrivateName("torch._inductor.codegen.common", "init_backend_registration", "compilation.inductor_supports", ()),
    PrivateName("multiprocessing.process", "_children", "multiprocessing_children (supervision)"),
    PrivateName("torch.cuda", "_is_in_bad_fork",
                "is_in_bad_fork, has_bad_fork_check (runtime, devices: any device module's)"),
    PrivateName("torch._inductor.codegen.common", "get_scheduling_for_device", "compilation.inductor_supports",
                ("device",)),
)

_TRAINER_DDP = "lightning.pytorch.strategies.DDPStrategy"
#: Lightning's spawn/fork launchers (the classes :data:`TrainerMultiProcessingLauncher` and
#: :data:`FabricMultiProcessingLauncher`), by name: what :mod:`lightning_anyaccel._lightning.stubs` declares hooks of.
TRAINER_MULTIPROCESSING_LAUNCHER = "lightning.pytorch.strategies.launchers.multiprocessing._MultiProcessingLauncher"
FABRIC_MULTIPROCESSING_LAUNCHER = "lightning.fabric.strategies.launchers.multiprocessing._MultiProcessingLauncher"
_FABRIC_DDP = "lightning.fabric.strategies.DDPStrategy"
_TRAINER_CONNECTOR = "lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector"
_FABRIC_CONNECTOR = "lightning.fabric.connector._Connector"

#: Every private attribute or method of a Lightning object that the package reads, writes or overrides.
PRIVATE_ATTRIBUTES: tuple[PrivateAttribute, ...] = (
    # strategies (both front ends)
    PrivateAttribute("lightning.pytorch.strategies.Strategy", "_precision_plugin",
                     "front_ends.TrainerSide.given_precision_plugin"),
    PrivateAttribute("lightning.fabric.strategies.Strategy", "_precision",
                     "front_ends.FabricSide.given_precision_plugin"),
    PrivateAttribute("lightning.pytorch.strategies.Strategy", "_checkpoint_io", "AnyStrategyMixin.checkpoint_io"),
    PrivateAttribute("lightning.fabric.strategies.Strategy", "_checkpoint_io", "AnyStrategyMixin.checkpoint_io"),
    PrivateAttribute("lightning.pytorch.strategies.Strategy", "_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute("lightning.fabric.strategies.Strategy", "_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute("lightning.pytorch.core.module.LightningModule", "_compiler_ctx", "compilation.compiled_parts"),
    PrivateAttribute("lightning.pytorch.strategies.ParallelStrategy", "_layer_sync", "AnyDistributedMixin._layer_sync"),
    PrivateAttribute("lightning.pytorch.strategies.SingleDeviceStrategy", "_root_device",
                     "accessors.single_device_root (policy._refuse_foreign)"),
    PrivateAttribute("lightning.fabric.strategies.SingleDeviceStrategy", "_root_device",
                     "accessors.single_device_root (policy._refuse_foreign)"),
    PrivateAttribute(_TRAINER_DDP, "_configure_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute(_FABRIC_DDP, "_configure_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute(_TRAINER_DDP, "_get_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute(_FABRIC_DDP, "_get_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute(_TRAINER_DDP, "_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute(_FABRIC_DDP, "_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute("lightning.pytorch.strategies.ParallelStrategy", "_parallel_devices",
                     "AnyDistributedMixin.parallel_devices"),
    PrivateAttribute("lightning.fabric.strategies.ParallelStrategy", "_parallel_devices",
                     "AnyDistributedMixin.parallel_devices"),
    # the Trainer's profiler
    PrivateAttribute("lightning.pytorch.profilers.PyTorchProfiler", "_profiler_kwargs", "policy.fit_profiler"),
    PrivateAttribute("lightning.pytorch.profilers.PyTorchProfiler", "_sort_by_key", "policy.fit_profiler"),
    PrivateAttribute(_TRAINER_DDP, "_start_method", "strategies.steps.check_start_method"),
    PrivateAttribute(_FABRIC_DDP, "_start_method", "strategies.steps.check_start_method"),
    PrivateAttribute(_TRAINER_DDP, "_timeout", "AnyDistributedMixin.timeout"),
    PrivateAttribute(_FABRIC_DDP, "_timeout", "AnyDistributedMixin.timeout"),
    PrivateAttribute(_TRAINER_DDP, "_ddp_kwargs", "AnyDistributedMixin._wrap_ddp"),
    PrivateAttribute(_FABRIC_DDP, "_ddp_kwargs", "AnyDistributedMixin._wrap_ddp"),
    PrivateAttribute(_FABRIC_DDP, "_set_world_ranks", "front_ends.FabricSide.set_world_ranks"),
    PrivateAttribute(_FABRIC_DDP, "_determine_ddp_device_ids", "strategies.ddp.FabricDDPStrategy.setup_module"),
    PrivateAttribute(_TRAINER_DDP, "_setup_model", "strategies.AnyDDPStrategy._setup_model"),
    PrivateAttribute(_TRAINER_DDP, "_register_ddp_hooks", "strategies.AnyDDPStrategy._register_ddp_hooks"),
    PrivateAttribute(_TRAINER_DDP, "_ddp_comm_state", "strategies.AnyDDPStrategy._register_ddp_hooks"),
    PrivateAttribute(_TRAINER_DDP, "_ddp_comm_hook", "strategies.AnyDDPStrategy._register_ddp_hooks"),
    PrivateAttribute(_TRAINER_DDP, "_ddp_comm_wrapper", "strategies.AnyDDPStrategy._register_ddp_hooks"),
    PrivateAttribute("lightning.pytorch.strategies.FSDPStrategy", "_setup_model", "strategies.AnyFSDPStrategy._setup_model"),
    PrivateAttribute("lightning.pytorch.strategies.FSDPStrategy", "_state_dict_type", "AnyFSDPMixin"),
    PrivateAttribute("lightning.fabric.strategies.FSDPStrategy", "_state_dict_type", "AnyFSDPMixin"),
    PrivateAttribute("lightning.pytorch.strategies.FSDPStrategy", "_activation_checkpointing_kwargs",
                     "strategies.fsdp.AnyFSDPMixin._wrap_fsdp"),
    PrivateAttribute("lightning.fabric.strategies.FSDPStrategy", "_activation_checkpointing_kwargs",
                     "strategies.fsdp.AnyFSDPMixin._wrap_fsdp"),
    PrivateAttribute("lightning.fabric.strategies.FSDPStrategy", "_fsdp_kwargs", "front_ends.FabricSide.fsdp_options"),
    PrivateAttribute("lightning.pytorch.strategies.ModelParallelStrategy", "_data_parallel_size",
                     "AnyModelParallelMixin"),
    PrivateAttribute("lightning.pytorch.strategies.ModelParallelStrategy", "_tensor_parallel_size",
                     "AnyModelParallelMixin"),
    PrivateAttribute("lightning.fabric.strategies.ModelParallelStrategy", "_data_parallel_size",
                     "AnyModelParallelMixin"),
    PrivateAttribute("lightning.fabric.strategies.ModelParallelStrategy", "_tensor_parallel_size",
                     "AnyModelParallelMixin"),
    PrivateAttribute("lightning.pytorch.strategies.DeepSpeedStrategy", "_init_deepspeed_distributed",
                     "strategies.deepspeed.AnyDeepSpeedMixin._setup_deepspeed_distributed"),
    PrivateAttribute("lightning.fabric.strategies.DeepSpeedStrategy", "_init_deepspeed_distributed",
                     "strategies.deepspeed.AnyDeepSpeedMixin._setup_deepspeed_distributed"),
    PrivateAttribute("lightning.pytorch.strategies.DeepSpeedStrategy", "_setup_model_and_optimizer",
                     "strategies.AnyDeepSpeedStrategy._setup_model_and_optimizer"),
    PrivateAttribute("lightning.pytorch.strategies.DeepSpeedStrategy", "_initialize_deepspeed_inference",
                     "strategies.AnyDeepSpeedStrategy._initialize_deepspeed_inference"),
    PrivateAttribute("lightning.fabric.strategies.DeepSpeedStrategy", "_initialize_engine",
                     "strategies.deepspeed.FabricDeepSpeedStrategy._initialize_engine"),
    PrivateAttribute("lightning.fabric.strategies.DeepSpeedStrategy", "_config_initialized",
                     "strategies.deepspeed.FabricDeepSpeedStrategy._setup_distributed"),
    PrivateAttribute("lightning.fabric.strategies.DeepSpeedStrategy", "_format_config",
                     "strategies.deepspeed.FabricDeepSpeedStrategy._setup_distributed"),
    PrivateAttribute("lightning.fabric.strategies.DeepSpeedStrategy", "_setup_distributed",
                     "strategies.deepspeed.FabricDeepSpeedStrategy._setup_distributed"),
    # launchers
    PrivateAttribute("lightning.pytorch.strategies.launchers.multiprocessing._MultiProcessingLauncher",
                     "_wrapping_function", "SafeLaunchMixin._wrapping_function"),
    PrivateAttribute("lightning.fabric.strategies.launchers.multiprocessing._MultiProcessingLauncher",
                     "_wrapping_function", "SafeLaunchMixin._wrapping_function"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.multiprocessing._MultiProcessingLauncher",
                     "_start_method", "SafeLaunchMixin.launch"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.multiprocessing._MultiProcessingLauncher",
                     "_strategy", "SafeLaunchMixin.launch"),
    # precision plugins and optimizers
    PrivateAttribute("lightning.pytorch.core.optimizer.LightningOptimizer", "_optimizer",
                     "strategies.AnyFSDPStrategy.optimizer_state"),
    # the connectors: what the hooks read and wrap
    PrivateAttribute(_TRAINER_CONNECTOR, "_choose_strategy", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_choose_strategy", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_check_strategy_and_fallback", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_check_strategy_and_fallback", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_lazy_init_strategy", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_lazy_init_strategy", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_strategy_flag", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_strategy_flag", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_parallel_devices", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_parallel_devices", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_num_nodes_flag", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_num_nodes_flag", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_check_config_and_set_final_flags", "install_connector_hooks"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_check_config_and_set_final_flags", "install_connector_hooks"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_registered_strategies", "install_connector_hooks (policy.rename_flags)"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_registered_strategies", "install_connector_hooks (policy.rename_flags)"),
    PrivateAttribute(_TRAINER_CONNECTOR, "_choose_auto_accelerator", "install_connector_hooks (auto.choose_accelerator)"),
    PrivateAttribute(_FABRIC_CONNECTOR, "_choose_auto_accelerator", "install_connector_hooks (auto.choose_accelerator)"),
    # torch.distributed: a third-party backend's creator and the group it returns (torch >= 2.15's
    # flight recorder needs the group's default backend; docs/limitations.md)
    PrivateAttribute("torch.distributed.Backend", "_plugins", "distributed.adopt_whole_group_backend"),
    PrivateAttribute("torch.distributed.ProcessGroup", "_backend_id", "distributed._name_the_default_backend"),
    PrivateAttribute("torch.distributed.ProcessGroup", "_set_default_backend", "distributed._name_the_default_backend"),
)


def private(module: str, name: str, distribution: Distribution = LIGHTNING) -> Any:
    """A private Lightning module attribute listed in :data:`PRIVATE_NAMES`, from ``distribution``.

    >>> private("lightning.fabric.accelerators.cpu", "_parse_cpu_cores")(2)
    2
    """
    if not any(entry.module == module and entry.name == name for entry in PRIVATE_NAMES):
        raise KeyError(f"{module}.{name} is not in lightning_anyaccel._lightning.PRIVATE_NAMES: list it there first.")
    return getattr(distribution.module(module), name)


__all__ = ["FABRIC_MULTIPROCESSING_LAUNCHER", "PRIVATE_ATTRIBUTES", "PRIVATE_NAMES", "PrivateAttribute", "PrivateName", "TRAINER_MULTIPROCESSING_LAUNCHER", "private"]
