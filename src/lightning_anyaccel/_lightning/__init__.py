"""The package's contract with Lightning: every private Lightning name it uses, and both packages.

Lightning is published twice: as ``lightning`` (``lightning.pytorch`` for the Trainer,
``lightning.fabric`` for Fabric) and as ``pytorch_lightning`` + ``lightning_fabric``. The same
classes exist in both, but they are different objects: a strategy built on
``lightning.pytorch.strategies.DDPStrategy`` is refused by ``pytorch_lightning.Trainer``.

This package is the one place that knows that, and the one place that touches what Lightning,
torch, DeepSpeed and ``multiprocessing`` do not promise (names starting with ``_``). Everything that can
break with a new Lightning or torch release is in it, one module per kind (:mod:`.porting`,
:mod:`.names`, :mod:`.accessors`, :mod:`.connector_patches`, :mod:`.memory_patches`):

- :class:`Distribution`, :data:`LIGHTNING` and :data:`PYTORCH_LIGHTNING` name the two packages, and
  :func:`port` rebuilds a class of this package on the other package's base classes. Classes of
  the package keep their behaviour in mixins (no Lightning base) and their Lightning base in
  an empty concrete class, so one code base serves both packages;
- :data:`PRIVATE_NAMES` and :data:`PRIVATE_ATTRIBUTES` list every private module attribute and
  every private attribute of a Lightning object the package reads or writes, with the package
  function that depends on it (``tests/test_lightning_contract.py`` checks them on the installed
  Lightning, and checks that the package uses no private name that is not listed here); the few
  private names of torch and ``multiprocessing`` the package touches are listed there too;
- :func:`private` is how this module reads a listed private module attribute, and every access
  the package needs is one small function here (:func:`destroy_process_group`,
  :func:`ddp_kwargs`, :func:`multiprocessing_children`, ...), which the rest of the package calls;
- :func:`install_connector_hooks` teaches Lightning's accelerator connectors (Trainer and Fabric)
  to ask :mod:`lightning_anyaccel.wiring.policy` which strategy to use with the package's accelerator;
- :func:`install_device_info_hook` lets the policy report the device a Trainer uses (Lightning's
  own report knows CUDA, MPS and TPU only, and warns "GPU available but not used" while the
  package trains on that GPU);
- :func:`install_profiler_hook` lets the policy fit a Trainer's ``PyTorchProfiler`` to its device
  (Lightning's records the host, and CUDA where CUDA is available);
- :func:`install_out_of_memory_hook` lets Lightning's out-of-memory detection (the batch-size
  finder's) recognise every device's out-of-memory error, not only CUDA's.

Example:
    >>> PYTORCH_LIGHTNING.translate("lightning.pytorch.strategies.ddp")
    'pytorch_lightning.strategies.ddp'
    >>> PYTORCH_LIGHTNING.translate("lightning.fabric.connector")
    'lightning_fabric.connector'
    >>> distribution_of_module("pytorch_lightning.trainer.trainer") is PYTORCH_LIGHTNING
    True
"""

from __future__ import annotations

from lightning_anyaccel._lightning.accessors import (
    FabricMultiProcessingLauncher,
    TrainerMultiProcessingLauncher,
    backend_creators,
    batchnorm_base,
    bound_deepspeed_new_group,
    checkpoint_io_given,
    compiler_context,
    ddp_comm_settings,
    ddp_kwargs,
    destroy_process_group,
    disable_module_memory_sharing,
    distributed_is_initialized,
    fabric_ddp_device_ids,
    fabric_fsdp_kwargs,
    fabric_given_precision,
    fabric_set_world_ranks,
    format_deepspeed_config_once,
    fsdp_activation_checkpointing_kwargs,
    fsdp_state_dict_type,
    full_state_dict_context_replaced,
    has_backend_type,
    has_bad_fork_check,
    inductor_schedules,
    init_deepspeed_distributed,
    is_in_bad_fork,
    is_interactive,
    launcher_strategy,
    model_parallel_sizes,
    move_torchmetrics_to_device,
    multiprocessing_children,
    parallel_devices_of,
    parse_cpu_cores,
    privateuse1_profiler_registered,
    probe_deepspeed_accelerator,
    process_group_backend_given,
    profiler_kwargs,
    register_ddp_comm_hook,
    set_checkpoint_io,
    set_data_parallel_size,
    set_default_backend,
    set_launcher,
    set_parallel_devices,
    set_profiler_sort_key,
    setup_activation_checkpointing,
    single_device_root,
    start_method_of,
    timeout_of,
    trainer_given_precision,
    unwrap_lightning_optimizer,
    validate_device_index_selection,
)
from lightning_anyaccel._lightning.connector_patches import (
    FABRIC_CONNECTOR,
    TRAINER_CONNECTOR,
    ConnectorPolicy,
    ConnectorView,
    constructor_arguments,
    install_connector_hooks,
    install_device_info_hook,
    install_profiler_hook,
    record_constructor_arguments,
)
from lightning_anyaccel._lightning.memory_patches import install_out_of_memory_hook
from lightning_anyaccel._lightning.names import (
    FABRIC_MULTIPROCESSING_LAUNCHER,
    PRIVATE_ATTRIBUTES,
    PRIVATE_NAMES,
    TRAINER_MULTIPROCESSING_LAUNCHER,
    PrivateAttribute,
    PrivateName,
    private,
)
from lightning_anyaccel._lightning.porting import (
    DISTRIBUTIONS,
    LIGHTNING,
    PYTORCH_LIGHTNING,
    Distribution,
    distribution_of,
    distribution_of_module,
    port,
    ported_class,
)

__all__ = [
    "FABRIC_MULTIPROCESSING_LAUNCHER",
    "DISTRIBUTIONS",
    "LIGHTNING",
    "PRIVATE_ATTRIBUTES",
    "PRIVATE_NAMES",
    "PYTORCH_LIGHTNING",
    "FABRIC_CONNECTOR",
    "TRAINER_CONNECTOR",
    "TRAINER_MULTIPROCESSING_LAUNCHER",
    "FabricMultiProcessingLauncher",
    "TrainerMultiProcessingLauncher",
    "ConnectorPolicy",
    "ConnectorView",
    "Distribution",
    "PrivateAttribute",
    "PrivateName",
    "distribution_of",
    "distribution_of_module",
    "constructor_arguments",
    "install_connector_hooks",
    "install_device_info_hook",
    "install_out_of_memory_hook",
    "install_profiler_hook",
    "privateuse1_profiler_registered",
    "profiler_kwargs",
    "set_profiler_sort_key",
    "record_constructor_arguments",
    "is_interactive",
    "port",
    "ported_class",
    "private",
    "parallel_devices_of",
    "set_parallel_devices",
    "process_group_backend_given",
    "timeout_of",
    "start_method_of",
    "set_launcher",
    "launcher_strategy",
    "ddp_kwargs",
    "ddp_comm_settings",
    "fabric_ddp_device_ids",
    "checkpoint_io_given",
    "set_checkpoint_io",
    "trainer_given_precision",
    "fabric_given_precision",
    "fabric_set_world_ranks",
    "fabric_fsdp_kwargs",
    "fsdp_state_dict_type",
    "fsdp_activation_checkpointing_kwargs",
    "unwrap_lightning_optimizer",
    "model_parallel_sizes",
    "set_data_parallel_size",
    "init_deepspeed_distributed",
    "probe_deepspeed_accelerator",
    "format_deepspeed_config_once",
    "backend_creators",
    "batchnorm_base",
    "bound_deepspeed_new_group",
    "compiler_context",
    "destroy_process_group",
    "disable_module_memory_sharing",
    "distributed_is_initialized",
    "full_state_dict_context_replaced",
    "has_backend_type",
    "has_bad_fork_check",
    "inductor_schedules",
    "is_in_bad_fork",
    "move_torchmetrics_to_device",
    "multiprocessing_children",
    "parse_cpu_cores",
    "register_ddp_comm_hook",
    "set_default_backend",
    "setup_activation_checkpointing",
    "single_device_root",
    "validate_device_index_selection",
]
