"""Every access to a private name, one small function each; the rest of the package calls these.

Part of the contract (:mod:`lightning_anyaccel._lightning`): each name touched here is listed in
:mod:`~lightning_anyaccel._lightning.names`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

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

from lightning_anyaccel._lightning.names import private
from lightning_anyaccel._lightning.porting import Distribution

# ----- every access to a private name, one small function each ------------------------------------
# The rest of the package calls these; none of it touches a private name of Lightning, torch,
# DeepSpeed or multiprocessing itself (tests/test_lightning_contract.py checks every name used here).


def is_interactive() -> bool:
    """Whether Lightning considers this an interactive session (a notebook or a REPL)."""
    return bool(private("lightning.fabric.utilities.imports", "_IS_INTERACTIVE"))


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


def _dispatch_full_state_dict_context(distribution: Distribution) -> None:
    """Once per package: its modules' ``_get_full_state_dict_context`` calls the scoped helper, else Lightning's own."""
    if distribution.package in _FULL_STATE_DICT_DISPATCHING:
        return
    for name in FULL_STATE_DICT_MODULES:
        module = distribution.module(name)
        original = private(name, "_get_full_state_dict_context", distribution)

        def dispatch(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            helper = _FULL_STATE_DICT_HELPER.get()
            return (helper or _original)(*args, **kwargs)

        dispatch.__wrapped__ = original  # type: ignore[attr-defined]  # functools' convention: the function it stands in for
        module._get_full_state_dict_context = dispatch
    _FULL_STATE_DICT_DISPATCHING.add(distribution.package)


@contextlib.contextmanager
def full_state_dict_context_replaced(distribution: Distribution, helper: Callable[..., Any]) -> Iterator[None]:
    """Fabric's FSDP and ModelParallel checkpoint code gather full state dicts through ``helper`` while this runs.

    Their ``save_checkpoint``/``load_checkpoint`` call a module-level ``_get_full_state_dict_context``
    that always offloads to CPU. The first use makes that function dispatch (in both modules): to
    ``helper`` inside this context, in this thread or task only (a :class:`contextvars.ContextVar`),
    and to Lightning's own everywhere else, so a save running beside it in another thread is not
    affected.
    """
    _dispatch_full_state_dict_context(distribution)
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


def single_device_root(strategy: Any) -> Any:
    """The device a single-device strategy of Lightning trains on (``torch.device``); ``None`` for any other strategy."""
    return getattr(strategy, "_root_device", None)


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


def unwrap_lightning_optimizer(optimizer: Any, distribution: Distribution) -> Any:
    """The torch optimizer inside the Trainer's ``LightningOptimizer`` (``optimizer`` itself otherwise)."""
    wrapper = distribution.module("lightning.pytorch.core.optimizer").LightningOptimizer
    return optimizer._optimizer if isinstance(optimizer, wrapper) else optimizer


def model_parallel_sizes(strategy: Any) -> tuple[Any, Any]:
    """``(data_parallel_size, tensor_parallel_size)`` of a ModelParallel strategy (``"auto"`` or a number)."""
    return strategy._data_parallel_size, strategy._tensor_parallel_size


def set_data_parallel_size(strategy: Any, size: int) -> None:
    """Set the data-parallel (sharding) dimension of a ModelParallel strategy's mesh."""
    strategy._data_parallel_size = size


def probe_deepspeed_accelerator() -> str | None:
    """Run DeepSpeed's own probe for the accelerator ``DS_ACCELERATOR`` names; ``None``, or DeepSpeed's message.

    ``get_accelerator()`` probes once per process and keeps its choice in the module's
    ``ds_accelerator``; the probe runs with that choice set aside and puts it back, so that it
    decides nothing for the process. DeepSpeed's first import asks for the accelerator itself:
    a failing probe then stops the import, which is the same answer.
    """
    try:
        from deepspeed.accelerator import real_accelerator
    except ValueError as err:
        return str(err)
    chosen = real_accelerator.ds_accelerator
    real_accelerator.ds_accelerator = None
    try:
        real_accelerator.get_accelerator()
    except (ValueError, AssertionError) as err:
        return str(err)
    finally:
        real_accelerator.ds_accelerator = chosen
    return None


def init_deepspeed_distributed(strategy: Any) -> None:
    """Lightning's start of DeepSpeed's process group (either front end)."""
    strategy._init_deepspeed_distributed()


def format_deepspeed_config_once(strategy: Any) -> None:
    """Fabric's DeepSpeed strategy: complete its DeepSpeed config once (what its own setup would do)."""
    if not strategy._config_initialized:
        strategy._format_config()
        strategy._config_initialized = True



def profiler_kwargs(profiler: Any) -> dict[str, Any]:
    """The keyword arguments a ``PyTorchProfiler`` hands ``torch.profiler.profile`` (its ``activities`` included)."""
    kwargs: dict[str, Any] = profiler._profiler_kwargs
    return kwargs


def set_profiler_sort_key(profiler: Any, key: str) -> None:
    """What a ``PyTorchProfiler``'s report is sorted by (any key of torch's ``EventList.table``)."""
    profiler._sort_by_key = key


#: torch's registry of a PrivateUse1 backend's Kineto activity profiler (C++, libtorch_cpu; torch >= 2.11).
PRIVATEUSE1_PROFILER_SYMBOLS = ("_ZN5torch8profiler4impl27PrivateUse1ProfilerRegistry8instanceEv",
                                "_ZNK5torch8profiler4impl27PrivateUse1ProfilerRegistry10hasFactoryEv")


def privateuse1_profiler_registered() -> bool | None:
    """Whether the PrivateUse1 backend registered an activity profiler with torch (what makes ``torch.profiler``
    record its device's time); ``None`` where this torch can not be asked (no such registry, another platform).

    ``torch.profiler.supported_activities()`` lists ``PrivateUse1`` for every renamed backend, whether or not
    anything records it; torch's registry (``PrivateUse1ProfilerRegistry::hasFactory``) is only in C++.
    """
    import ctypes
    from pathlib import Path

    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        torch_cpu = ctypes.CDLL(str(library))  # already loaded by torch: the same handle, nothing runs
        instance, has_factory = (torch_cpu[name] for name in PRIVATEUSE1_PROFILER_SYMBOLS)
    except (OSError, AttributeError):
        return None
    instance.restype, instance.argtypes = ctypes.c_void_p, []
    has_factory.restype, has_factory.argtypes = ctypes.c_bool, [ctypes.c_void_p]
    return bool(has_factory(instance()))


__all__ = ["FULL_STATE_DICT_MODULES", "FabricMultiProcessingLauncher", "TrainerMultiProcessingLauncher", "backend_creators", "batchnorm_base", "bound_deepspeed_new_group", "checkpoint_io_given", "compiler_context", "ddp_comm_settings", "ddp_kwargs", "destroy_process_group", "disable_module_memory_sharing", "distributed_is_initialized", "fabric_ddp_device_ids", "fabric_fsdp_kwargs", "fabric_given_precision", "fabric_set_world_ranks", "format_deepspeed_config_once", "fsdp_activation_checkpointing_kwargs", "fsdp_state_dict_type", "full_state_dict_context_replaced", "has_backend_type", "has_bad_fork_check", "inductor_schedules", "init_deepspeed_distributed", "is_in_bad_fork", "is_interactive", "launcher_strategy", "model_parallel_sizes", "move_torchmetrics_to_device", "multiprocessing_children", "parallel_devices_of", "parse_cpu_cores", "privateuse1_profiler_registered", "probe_deepspeed_accelerator", "process_group_backend_given", "profiler_kwargs", "register_ddp_comm_hook", "set_checkpoint_io", "set_data_parallel_size", "set_default_backend", "set_launcher", "set_parallel_devices", "set_profiler_sort_key", "setup_activation_checkpointing", "start_method_of", "timeout_of", "trainer_given_precision", "unwrap_lightning_optimizer", "validate_device_index_selection"]
