"""The package's contract with Lightning: every private Lightning name it uses, and both packages.

Lightning is published twice: as ``lightning`` (``lightning.pytorch`` for the Trainer,
``lightning.fabric`` for Fabric) and as ``pytorch_lightning`` + ``lightning_fabric``. The same
classes exist in both, but they are different objects: a strategy built on
``lightning.pytorch.strategies.DDPStrategy`` is refused by ``pytorch_lightning.Trainer``.

This module is the one place that knows that, and the one place that touches what Lightning,
torch, DeepSpeed and ``multiprocessing`` do not promise (names starting with ``_``). It is long
(the list of names and one small function per access) so that everything that can break with a
new Lightning or torch release is in one file:

- :class:`FrontEnd`, :data:`LIGHTNING` and :data:`PYTORCH_LIGHTNING` name the two packages, and
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
  to ask :mod:`lightning_anyaccel.policy` which strategy to use with the package's accelerator;
- :func:`install_device_info_hook` lets the policy report the device a Trainer uses (Lightning's
  own report knows CUDA, MPS and TPU only, and warns "GPU available but not used" while the
  package trains on that GPU).

Example:
    >>> PYTORCH_LIGHTNING.translate("lightning.pytorch.strategies.ddp")
    'pytorch_lightning.strategies.ddp'
    >>> PYTORCH_LIGHTNING.translate("lightning.fabric.connector")
    'lightning_fabric.connector'
    >>> front_end_of_module("pytorch_lightning.trainer.trainer") is PYTORCH_LIGHTNING
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FunctionType
from typing import TYPE_CHECKING, Any, TypeVar, cast

# Lightning's spawn/fork launchers (Trainer's and Fabric's), listed in PRIVATE_NAMES: imported as
# classes (not read through `private`) so that the type checker knows the package's launchers' bases.
from lightning.fabric.strategies.launchers.multiprocessing import (
    _MultiProcessingLauncher as FabricMultiProcessingLauncher,
)
from lightning.pytorch.strategies.launchers.multiprocessing import (
    _MultiProcessingLauncher as TrainerMultiProcessingLauncher,
)

if TYPE_CHECKING:
    from torch.nn.modules.batchnorm import _BatchNorm

T = TypeVar("T")


@dataclass(frozen=True)
class FrontEnd:
    """One Lightning distribution, as users import it.

    Args:
        package: the top-level module users import (``"lightning"`` or ``"pytorch_lightning"``).
        trainer: the module root of its Trainer.
        fabric: the module root of its Fabric.
    """

    package: str
    trainer: str
    fabric: str

    def translate(self, module: str) -> str:
        """The name of ``module`` (a module of the ``lightning`` package) in this front end."""
        for root_of_lightning, own in ((LIGHTNING.trainer, self.trainer), (LIGHTNING.fabric, self.fabric)):
            if module == root_of_lightning or module.startswith(root_of_lightning + "."):
                return own + module[len(root_of_lightning):]
        return module

    def is_installed(self) -> bool:
        """Whether this distribution can be imported here (without importing it)."""
        return importlib.util.find_spec(self.package) is not None

    def module(self, name: str) -> Any:
        """Import a module of this front end, named as in ``lightning`` (``"lightning.fabric.connector"``)."""
        return importlib.import_module(self.translate(name))


#: ``import lightning`` (``lightning.pytorch`` and ``lightning.fabric``): the package's classes are written for it.
LIGHTNING = FrontEnd("lightning", "lightning.pytorch", "lightning.fabric")
#: ``import pytorch_lightning`` (with the stand-alone ``lightning_fabric``).
PYTORCH_LIGHTNING = FrontEnd("pytorch_lightning", "pytorch_lightning", "lightning_fabric")
FRONT_ENDS: tuple[FrontEnd, ...] = (LIGHTNING, PYTORCH_LIGHTNING)


def front_end_of_module(module: str) -> FrontEnd | None:
    """The front end a module belongs to, ``None`` for modules of neither."""
    for front_end in FRONT_ENDS:
        for root in (front_end.trainer, front_end.fabric):
            if module == root or module.startswith(root + "."):
                return front_end
    return None


def front_end_of(obj: Any) -> FrontEnd | None:
    """The front end whose Lightning classes ``obj`` (an instance or a class) is built on.

    >>> from lightning.pytorch import Trainer
    >>> front_end_of(Trainer) is LIGHTNING
    True
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        front_end = front_end_of_module(klass.__module__)
        if front_end is not None:
            return front_end
    return None


# ----- one code base for both packages ------------------------------------------------------------

_PORTED: dict[tuple[type, str], type] = {}

#: Where the ported classes of each front end can be imported from (and found again by pickle):
#: (front end package, the original lives under lightning_anyaccel.fabric) -> module.
_PORT_MODULES: dict[tuple[str, bool], str] = {
    ("pytorch_lightning", False): "lightning_anyaccel.pytorch_lightning",
    ("pytorch_lightning", True): "lightning_anyaccel.lightning_fabric",
}


def port(obj: T, front_end: FrontEnd) -> T:
    """``obj`` for ``front_end``: Lightning classes are looked up there, the package's classes rebuilt.

    A class of this package whose bases include a Lightning class is rebuilt once (then cached)
    on the ported bases, with every class attribute ported the same way. Methods share their code
    with the original; only their ``__class__`` cell (what zero-argument ``super()`` reads) points at
    the rebuilt class. The rebuilt class lives in :mod:`lightning_anyaccel.pytorch_lightning` (Trainer
    side) or :mod:`lightning_anyaccel.lightning_fabric` (Fabric side), under the same name, so
    pickle (``spawn``) finds it again. Everything else is returned unchanged.

    >>> from lightning_anyaccel.strategies import AnyDDPStrategy
    >>> ported = port(AnyDDPStrategy, PYTORCH_LIGHTNING)
    >>> ported.__module__, [c.__module__ for c in ported.__mro__ if c.__name__ == "DDPStrategy"]
    ('lightning_anyaccel.pytorch_lightning', ['pytorch_lightning.strategies.ddp'])
    """
    if front_end is LIGHTNING or not isinstance(obj, type):
        return obj
    if front_end_of_module(obj.__module__) is LIGHTNING:
        module = importlib.import_module(front_end.translate(obj.__module__))
        return cast(T, functools.reduce(getattr, obj.__qualname__.split("."), module))
    if not obj.__module__.startswith("lightning_anyaccel") or front_end_of(obj) is not LIGHTNING:
        return obj
    key = (obj, front_end.package)
    if key not in _PORTED:
        _PORTED[key] = _rebuild(obj, front_end)
    return _PORTED[key]  # type: ignore[return-value]


def ported_class(module: str, name: str) -> type:
    """The ported class that ``module`` (one of :data:`_PORT_MODULES`) exposes as ``name`` (for pickle).

    Raises:
        AttributeError: no class of that name was ported for that module yet.
    """
    for (original, package), ported in _PORTED.items():
        if ported.__module__ == module and ported.__qualname__ == name:
            return ported
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def _rebuild(cls: type, front_end: FrontEnd) -> type:
    class_cell = types.CellType()
    namespace = {
        name: _rebind(port(value, front_end), class_cell, f"{cls.__qualname__}.{name}")
        for name, value in vars(cls).items()
        if name not in ("__dict__", "__weakref__")
    }
    namespace["_front_end"] = front_end
    fabric_side = cls.__module__.startswith("lightning_anyaccel.fabric")
    namespace["__module__"] = _PORT_MODULES[(front_end.package, fabric_side)]
    bases = tuple(port(base, front_end) for base in cls.__bases__)
    rebuilt = type(cls)(cls.__name__, bases, namespace)
    class_cell.cell_contents = rebuilt
    return rebuilt


def _rebind(value: Any, class_cell: types.CellType, where: str) -> Any:
    """``value`` with the ``__class__`` cell of its functions replaced by ``class_cell``."""
    if isinstance(value, staticmethod):
        return staticmethod(_rebind(value.__func__, class_cell, where))
    if isinstance(value, classmethod):
        return classmethod(_rebind(value.__func__, class_cell, where))
    if isinstance(value, property):
        fget, fset, fdel = (_rebind(f, class_cell, where) for f in (value.fget, value.fset, value.fdel))
        return property(fget, fset, fdel, value.__doc__)
    if not isinstance(value, FunctionType) or "__class__" not in value.__code__.co_freevars:
        wrapped = getattr(value, "__wrapped__", None)
        while wrapped is not None:
            if isinstance(wrapped, FunctionType) and "__class__" in wrapped.__code__.co_freevars:
                raise TypeError(f"{where} wraps a function that uses super(): it can not be ported; unwrap it.")
            wrapped = getattr(wrapped, "__wrapped__", None)
        return value
    closure = tuple(
        class_cell if name == "__class__" else cell
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ())
    )
    function = FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, closure)
    function.__kwdefaults__ = value.__kwdefaults__
    return functools.update_wrapper(function, value, updated=())


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
#: :data:`FabricMultiProcessingLauncher`), by name: what :mod:`lightning_anyaccel.lightning_hooks` declares hooks of.
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
    PrivateAttribute("lightning.pytorch.strategies.SingleDeviceStrategy", "_root_device", "policy._refuse_foreign"),
    PrivateAttribute("lightning.fabric.strategies.SingleDeviceStrategy", "_root_device", "policy._refuse_foreign"),
    PrivateAttribute(_TRAINER_DDP, "_configure_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute(_FABRIC_DDP, "_configure_launcher", "AnyDistributedMixin._configure_launcher"),
    PrivateAttribute(_TRAINER_DDP, "_get_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute(_FABRIC_DDP, "_get_process_group_backend", "AnyDistributedMixin._get_process_group_backend"),
    PrivateAttribute(_TRAINER_DDP, "_process_group_backend", "AnyDistributedMixin._resolve_backend"),
    PrivateAttribute(_FABRIC_DDP, "_process_group_backend", "AnyDistributedMixin._resolve_backend"),
    PrivateAttribute("lightning.pytorch.strategies.ParallelStrategy", "_parallel_devices",
                     "AnyDistributedMixin.parallel_devices"),
    PrivateAttribute("lightning.fabric.strategies.ParallelStrategy", "_parallel_devices",
                     "AnyDistributedMixin.parallel_devices"),
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
    # torch.distributed: a third-party backend's creator and the group it returns (torch >= 2.15's
    # flight recorder needs the group's default backend; docs/limitations.md)
    PrivateAttribute("torch.distributed.Backend", "_plugins", "distributed.adopt_whole_group_backend"),
    PrivateAttribute("torch.distributed.ProcessGroup", "_backend_id", "distributed._name_the_default_backend"),
    PrivateAttribute("torch.distributed.ProcessGroup", "_set_default_backend", "distributed._name_the_default_backend"),
)


def private(module: str, name: str, front_end: FrontEnd = LIGHTNING) -> Any:
    """A private Lightning module attribute listed in :data:`PRIVATE_NAMES`, from ``front_end``.

    >>> private("lightning.fabric.accelerators.cpu", "_parse_cpu_cores")(2)
    2
    """
    if not any(entry.module == module and entry.name == name for entry in PRIVATE_NAMES):
        raise KeyError(f"{module}.{name} is not in lightning_anyaccel._lightning.PRIVATE_NAMES: list it there first.")
    return getattr(front_end.module(module), name)


def is_interactive() -> bool:
    """Whether Lightning considers this an interactive session (a notebook or a REPL)."""
    return bool(private("lightning.fabric.utilities.imports", "_IS_INTERACTIVE"))


# ----- every access to a private name, one small function each ------------------------------------
# The rest of the package calls these; none of it touches a private name of Lightning, torch,
# DeepSpeed or multiprocessing itself (tests/test_lightning_contract.py checks every name used here).


def parse_cpu_cores(devices: Any) -> int:
    """Lightning's parsing of ``devices=`` for CPU (a count of processes).

    >>> parse_cpu_cores(2)
    2
    """
    return int(private("lightning.fabric.accelerators.cpu", "_parse_cpu_cores")(devices))


def disable_module_memory_sharing(data: Any) -> Any:
    """``data`` with every module's tensors copied out of shared memory (what ``spawn`` put them in)."""
    return private("lightning.fabric.strategies.launchers.multiprocessing", "_disable_module_memory_sharing")(data)


def destroy_process_group() -> None:
    """Lightning's clean destruction of the default process group (a no-op when there is none)."""
    private("lightning.fabric.utilities.distributed", "_destroy_dist_connection")()


def distributed_is_initialized() -> bool:
    """Whether the default process group exists (Lightning's check, safe where ``torch.distributed`` is not built)."""
    return bool(private("lightning.fabric.utilities.distributed", "_distributed_is_initialized")())


def register_ddp_comm_hook(model: Any, ddp_comm_state: Any, ddp_comm_hook: Any, ddp_comm_wrapper: Any) -> None:
    """Lightning's registration of a DDP communication hook (it calls it on CUDA only)."""
    private("lightning.pytorch.overrides.distributed", "_register_ddp_comm_hook")(
        model=model, ddp_comm_state=ddp_comm_state, ddp_comm_hook=ddp_comm_hook, ddp_comm_wrapper=ddp_comm_wrapper
    )


def move_torchmetrics_to_device(module: Any, device: Any) -> None:
    """Lightning's move of the torchmetrics inside an FSDP-wrapped module to ``device``."""
    private("lightning.fabric.strategies.fsdp", "_move_torchmetrics_to_device")(module, device)


def setup_activation_checkpointing(module: Any, activation_checkpointing_kwargs: dict[str, Any]) -> None:
    """Lightning's activation checkpointing of an FSDP-wrapped module."""
    setup = private("lightning.fabric.strategies.fsdp", "_setup_activation_checkpointing")
    setup(module, activation_checkpointing_kwargs)


def validate_device_index_selection(parallel_devices: Any) -> None:
    """Lightning's check that DeepSpeed's devices are numbered ``0..n-1``."""
    private("lightning.fabric.strategies.deepspeed", "_validate_device_index_selection")(parallel_devices)


#: The full-state-dict helper of the FSDP save or load running in this thread (or task), if any.
_FULL_STATE_DICT_HELPER: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar(
    "lightning_anyaccel_full_state_dict_helper", default=None)
#: The packages (``lightning``, ``lightning_fabric``) whose modules already dispatch through it.
_FULL_STATE_DICT_DISPATCHING: set[str] = set()
#: Fabric's modules whose checkpoint code calls the module-level ``_get_full_state_dict_context``.
FULL_STATE_DICT_MODULES = ("lightning.fabric.strategies.fsdp", "lightning.fabric.strategies.model_parallel")


def _dispatch_full_state_dict_context(front_end: FrontEnd) -> None:
    """Once per package: its modules' ``_get_full_state_dict_context`` calls the scoped helper, else Lightning's own."""
    if front_end.package in _FULL_STATE_DICT_DISPATCHING:
        return
    for name in FULL_STATE_DICT_MODULES:
        module = front_end.module(name)
        original = private(name, "_get_full_state_dict_context", front_end)

        def dispatch(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            helper = _FULL_STATE_DICT_HELPER.get()
            return (helper or _original)(*args, **kwargs)

        dispatch.__wrapped__ = original  # type: ignore[attr-defined]  # functools' convention: the function it stands in for
        module._get_full_state_dict_context = dispatch
    _FULL_STATE_DICT_DISPATCHING.add(front_end.package)


@contextlib.contextmanager
def full_state_dict_context_replaced(front_end: FrontEnd, helper: Callable[..., Any]) -> Iterator[None]:
    """Fabric's FSDP and ModelParallel checkpoint code gather full state dicts through ``helper`` while this runs.

    Their ``save_checkpoint``/``load_checkpoint`` call a module-level ``_get_full_state_dict_context``
    that always offloads to CPU. The first use makes that function dispatch (in both modules): to
    ``helper`` inside this context, in this thread or task only (a :class:`contextvars.ContextVar`),
    and to Lightning's own everywhere else, so a save running beside it in another thread is not
    affected.
    """
    _dispatch_full_state_dict_context(front_end)
    token = _FULL_STATE_DICT_HELPER.set(helper)
    try:
        yield
    finally:
        _FULL_STATE_DICT_HELPER.reset(token)


def inductor_schedules(device_type: str) -> bool:
    """Whether Inductor has a code generator (a scheduling) registered for ``device_type``."""
    private("torch._inductor.codegen.common", "init_backend_registration")()
    return private("torch._inductor.codegen.common", "get_scheduling_for_device")(device_type) is not None


def batchnorm_base() -> type[_BatchNorm]:
    """torch's base class of every BatchNorm (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``)."""
    base: type[_BatchNorm] = private("torch.nn.modules.batchnorm", "_BatchNorm")
    return base


def compiler_context(module: Any) -> Any:
    """The compile context Lightning keeps on a LightningModule given as ``torch.compile(model)``, else ``None``."""
    try:
        return module._compiler_ctx
    except AttributeError:
        return None


def backend_creators() -> dict[str, Any]:
    """torch's registry of third-party collective backends: upper-case name -> creator (changed in place)."""
    import torch.distributed as dist

    try:
        plugins: dict[str, Any] = dist.Backend._plugins
    except AttributeError:
        return {}
    return plugins


def has_backend_type(group: Any, backend_type: Any) -> bool:
    """Whether the process group ``group`` registered a backend of ``backend_type``."""
    try:
        group._backend_id(backend_type)
    except RuntimeError:  # no backend of this type on the group
        return False
    return True


def set_default_backend(group: Any, backend_type: Any) -> None:
    """Make ``backend_type`` the default backend of the process group ``group``."""
    group._set_default_backend(backend_type)


def has_bad_fork_check(device_module: Any) -> bool:
    """Whether a torch device module can tell that a forked child inherited an initialised device."""
    return callable(getattr(device_module, "_is_in_bad_fork", None))


def is_in_bad_fork(device_module: Any) -> bool:
    """Whether this process is a child forked after its parent initialised the device (where the module can tell)."""
    try:
        probe = device_module._is_in_bad_fork
    except AttributeError:
        return False
    return callable(probe) and bool(probe())


def multiprocessing_children() -> list[int]:
    """The process ids of the ``multiprocessing`` children this process started and has not joined yet."""
    import multiprocessing.process

    return [child.pid for child in list(multiprocessing.process._children)]  # type: ignore[attr-defined]


def bound_deepspeed_new_group(timeout: Any) -> bool:
    """Make DeepSpeed's communication backend create its process groups with ``timeout``.

    Returns whether DeepSpeed's backend exists (after ``deepspeed.init_distributed``) and was patched.
    """
    try:
        from deepspeed.comm import comm as deepspeed_comm
    except ImportError:
        return False
    backend = deepspeed_comm.cdb
    if backend is None:
        return False
    import torch.distributed

    def new_group(ranks: Any) -> Any:
        return torch.distributed.new_group(ranks, timeout=timeout)

    backend.new_group = new_group
    return True


# ----- Lightning's private state of strategies and launchers, read and written only here ----------


def parallel_devices_of(strategy: Any) -> Any:
    """The devices Lightning keeps for the local ranks of a parallel strategy."""
    return strategy._parallel_devices


def set_parallel_devices(strategy: Any, devices: Any) -> None:
    """Store the devices of the local ranks where Lightning keeps them."""
    strategy._parallel_devices = devices


def process_group_backend_given(strategy: Any) -> str | None:
    """The ``process_group_backend=`` the user gave (``None``: choose one)."""
    backend: str | None = strategy._process_group_backend
    return backend


def timeout_of(strategy: Any) -> Any:
    """The ``timeout=`` a DDP-like strategy keeps for its collectives."""
    return strategy._timeout


def start_method_of(obj: Any) -> str:
    """The start method of a DDP-like strategy or of a multiprocessing launcher."""
    method: str = obj._start_method
    return method


def set_launcher(strategy: Any, launcher: Any) -> None:
    """Make ``launcher`` the strategy's launcher."""
    strategy._launcher = launcher


def launcher_strategy(launcher: Any) -> Any:
    """The strategy a multiprocessing launcher starts processes for."""
    return launcher._strategy


def ddp_kwargs(strategy: Any) -> dict[str, Any]:
    """The extra ``DistributedDataParallel`` arguments a DDP strategy keeps."""
    kwargs: dict[str, Any] = strategy._ddp_kwargs
    return kwargs


def ddp_comm_settings(strategy: Any) -> dict[str, Any]:
    """The Trainer DDP strategy's communication hook settings, as :func:`register_ddp_comm_hook` takes them."""
    return {"ddp_comm_state": strategy._ddp_comm_state, "ddp_comm_hook": strategy._ddp_comm_hook,
            "ddp_comm_wrapper": strategy._ddp_comm_wrapper}


def fabric_ddp_device_ids(strategy: Any) -> Any:
    """The ``device_ids`` Fabric's DDP strategy passes to ``DistributedDataParallel``."""
    return strategy._determine_ddp_device_ids()


def checkpoint_io_given(strategy: Any) -> Any:
    """The checkpoint IO the strategy was given (``None``: Lightning's default)."""
    return strategy._checkpoint_io


def set_checkpoint_io(strategy: Any, io: Any) -> None:
    """Give the strategy its checkpoint IO."""
    strategy._checkpoint_io = io


def trainer_given_precision(strategy: Any) -> Any:
    """The precision plugin a Trainer strategy was given (``None``: Lightning's default)."""
    return strategy._precision_plugin


def fabric_given_precision(strategy: Any) -> Any:
    """The precision plugin a Fabric strategy was given (``None``: Lightning's default)."""
    return strategy._precision


def fabric_set_world_ranks(strategy: Any) -> None:
    """Fabric's strategies: set global rank and world size from the cluster environment."""
    strategy._set_world_ranks()


def fabric_fsdp_kwargs(strategy: Any) -> dict[str, Any]:
    """The extra ``FullyShardedDataParallel`` arguments Fabric's FSDP strategy keeps."""
    kwargs: dict[str, Any] = strategy._fsdp_kwargs
    return kwargs


def fsdp_state_dict_type(strategy: Any) -> str:
    """``"full"`` or ``"sharded"``: how an FSDP strategy saves checkpoints."""
    state_dict_type: str = strategy._state_dict_type
    return state_dict_type


def fsdp_activation_checkpointing_kwargs(strategy: Any) -> dict[str, Any]:
    """The activation checkpointing arguments an FSDP strategy keeps."""
    kwargs: dict[str, Any] = strategy._activation_checkpointing_kwargs
    return kwargs


def unwrap_lightning_optimizer(optimizer: Any, front_end: FrontEnd) -> Any:
    """The torch optimizer inside the Trainer's ``LightningOptimizer`` (``optimizer`` itself otherwise)."""
    wrapper = front_end.module("lightning.pytorch.core.optimizer").LightningOptimizer
    return optimizer._optimizer if isinstance(optimizer, wrapper) else optimizer


def model_parallel_sizes(strategy: Any) -> tuple[Any, Any]:
    """``(data_parallel_size, tensor_parallel_size)`` of a ModelParallel strategy (``"auto"`` or a number)."""
    return strategy._data_parallel_size, strategy._tensor_parallel_size


def set_data_parallel_size(strategy: Any, size: int) -> None:
    """Set the data-parallel (sharding) dimension of a ModelParallel strategy's mesh."""
    strategy._data_parallel_size = size


def init_deepspeed_distributed(strategy: Any) -> None:
    """Lightning's start of DeepSpeed's process group (either front end)."""
    strategy._init_deepspeed_distributed()


def format_deepspeed_config_once(strategy: Any) -> None:
    """Fabric's DeepSpeed strategy: complete its DeepSpeed config once (what its own setup would do)."""
    if not strategy._config_initialized:
        strategy._format_config()
        strategy._config_initialized = True


# ----- the accelerator connectors -----------------------------------------------------------------

#: The accelerator connectors of the Trainer and of Fabric (names as in ``lightning``).
TRAINER_CONNECTOR = _TRAINER_CONNECTOR
FABRIC_CONNECTOR = _FABRIC_CONNECTOR


@dataclass
class ConnectorView:
    """What the policy reads and changes on a Lightning connector (Trainer's or Fabric's)."""

    connector: Any

    @property
    def accelerator(self) -> Any:
        return getattr(self.connector, "accelerator", None)

    @property
    def strategy_flag(self) -> Any:
        return self.connector._strategy_flag

    @strategy_flag.setter
    def strategy_flag(self, value: Any) -> None:
        self.connector._strategy_flag = value

    @property
    def num_devices(self) -> int:
        return len(self.connector._parallel_devices or [])

    @property
    def num_nodes(self) -> int:
        return int(self.connector._num_nodes_flag)

    @property
    def strategy(self) -> Any:
        return self.connector.strategy

    @property
    def precision(self) -> Any:
        """The precision plugin the connector made (Trainer: ``precision_plugin``; Fabric: ``precision``)."""
        return getattr(self.connector, self._precision_attr)

    @precision.setter
    def precision(self, plugin: Any) -> None:
        setattr(self.connector, self._precision_attr, plugin)

    @property
    def _precision_attr(self) -> str:
        return "precision_plugin" if hasattr(self.connector, "precision_plugin") else "precision"


_HOOK_MARK = "__lightning_anyaccel_hooks__"


@dataclass(frozen=True)
class ConnectorPolicy:
    """The package's decisions, as :func:`install_connector_hooks` asks for them."""

    #: Whether an accelerator is the package's (only then does the policy decide anything).
    owns: Callable[[Any], bool]
    #: ``strategy="auto"``: the strategy to use.
    choose: Callable[[ConnectorView], Any]
    #: May replace a Lightning strategy name by the package's equivalent.
    translate: Callable[[ConnectorView], None]
    #: Refuses or repairs the strategy before Lightning configures its launcher.
    check: Callable[[ConnectorView], None]
    #: Refuses arguments built for another front end (``(front_end, arguments)``), for every accelerator.
    check_arguments: Callable[[FrontEnd, tuple[Any, ...]], None]
    #: Reports the device a Trainer with the package's accelerator uses (instead of Lightning's report).
    log_device_info: Callable[[Any], None]
    #: After Lightning's report for its own accelerators: names a present device only the package serves.
    log_unused_devices: Callable[[Any], None] = lambda trainer: None


def install_connector_hooks(front_end: FrontEnd, connector: str, policy: ConnectorPolicy) -> None:
    """Let ``policy`` choose and check strategies for the package's accelerator (idempotent).

    Lightning's connectors pick ``SingleDeviceStrategy("cpu")`` or ``"ddp"`` for any accelerator
    that is not CUDA/MPS and have no hook for a third-party accelerator to change that. For a
    connector whose accelerator ``policy.owns``, this wraps three connector methods, in the order
    Lightning calls them:

    - ``_choose_strategy`` (only for ``strategy="auto"``): ``policy.choose`` returns the strategy;
    - ``_check_strategy_and_fallback``: ``policy.translate`` may replace a Lightning strategy name
      by the package's equivalent (before Lightning's CUDA-only refusals run);
    - ``_lazy_init_strategy``: ``policy.check`` refuses or repairs the strategy before Lightning
      configures its launcher.

    Connectors of every other accelerator run Lightning's code unchanged. A fourth wrap,
    ``_check_config_and_set_final_flags``, passes the user's arguments to
    ``policy.check_arguments`` first, so objects of the package built for the other front end
    fail with a message instead of Lightning's "invalid accelerator name".
    """
    module_name, _, class_name = connector.rpartition(".")
    connector_class = getattr(front_end.module(module_name), class_name)
    if connector_class.__dict__.get(_HOOK_MARK, False):
        return

    def choose(original: Callable[[], Any], view: ConnectorView) -> Any:
        return policy.choose(view)

    def translate(original: Callable[[], Any], view: ConnectorView) -> Any:
        policy.translate(view)
        return original()

    def check(original: Callable[[], Any], view: ConnectorView) -> Any:
        policy.check(view)
        return original()

    _wrap(connector_class, "_choose_strategy", policy.owns, choose)
    _wrap(connector_class, "_check_strategy_and_fallback", policy.owns, translate)
    _wrap(connector_class, "_lazy_init_strategy", policy.owns, check)

    original_flags = connector_class._check_config_and_set_final_flags

    @functools.wraps(original_flags)
    def check_flags(self: Any, *args: Any, **kwargs: Any) -> Any:
        policy.check_arguments(front_end, (*args, *kwargs.values()))
        return original_flags(self, *args, **kwargs)

    connector_class._check_config_and_set_final_flags = check_flags
    setattr(connector_class, _HOOK_MARK, True)


_DEVICE_INFO = ("lightning.pytorch.trainer.setup", "_log_device_info")


def install_device_info_hook(front_end: FrontEnd, policy: ConnectorPolicy) -> None:
    """Let ``policy.log_device_info`` report the device of a Trainer with the package's accelerator (idempotent).

    ``Trainer.__init__`` calls ``setup._log_device_info(trainer)``, which only knows CUDA, MPS and TPU:
    for ``AnyAccelerator`` on a GPU it logs "used: False" and warns "GPU available but not used",
    and for every other device type it says nothing. Trainers of every other accelerator keep
    Lightning's report.
    """
    module = front_end.module(_DEVICE_INFO[0])
    original = getattr(module, _DEVICE_INFO[1])
    if getattr(original, _HOOK_MARK, False):
        return

    @functools.wraps(original)
    def log_device_info(trainer: Any) -> None:
        if policy.owns(getattr(trainer, "accelerator", None)):
            policy.log_device_info(trainer)
        else:
            original(trainer)
            policy.log_unused_devices(trainer)

    setattr(log_device_info, _HOOK_MARK, True)
    setattr(module, _DEVICE_INFO[1], log_device_info)


def _wrap(
    cls: type,
    method: str,
    owns: Callable[[Any], bool],
    replacement: Callable[[Callable[[], Any], ConnectorView], Any],
) -> None:
    original = getattr(cls, method)
    if not inspect.isfunction(original):
        raise TypeError(f"{cls.__qualname__}.{method} is not a plain method any more; lightning_anyaccel can not hook it.")

    @functools.wraps(original)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not owns(getattr(self, "accelerator", None)):
            return original(self, *args, **kwargs)
        return replacement(lambda: original(self, *args, **kwargs), ConnectorView(self))

    setattr(cls, method, hooked)


__all__ = [
    "FABRIC_MULTIPROCESSING_LAUNCHER",
    "FRONT_ENDS",
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
    "FrontEnd",
    "PrivateAttribute",
    "PrivateName",
    "front_end_of",
    "front_end_of_module",
    "install_connector_hooks",
    "install_device_info_hook",
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
    "validate_device_index_selection",
]
