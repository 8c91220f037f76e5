"""Behaviour shared by every strategy of the package, for the Trainer and for Fabric.

The strategies differ only in what Lightning base class they extend; everything that knows
about devices (precision alignment, backend choice, fork safety, DDP wrapping, barriers,
portable checkpoint loading) lives here once.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable

import torch
from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing
from lightning.fabric.utilities.distributed import _destroy_dist_connection, _distributed_is_initialized
from torch.nn.parallel import DistributedDataParallel

from lightning_anyaccel import runtime
from lightning_anyaccel.checkpoint import portable_map_location
from lightning_anyaccel.devices import DeviceSpec, get_spec
from lightning_anyaccel.distributed import check_fork_safe, resolve_backend
from lightning_anyaccel.precision import align_precision_plugin


class AnyStrategyMixin:
    """Device-generic overrides; mixed in before a Lightning strategy class.

    Relies on the Lightning strategy API only: ``root_device``, ``accelerator``,
    ``precision_plugin`` (``precision`` in Fabric) and ``checkpoint_io``.
    """

    root_device: torch.device
    accelerator: Any
    _precision_attr: str = "precision_plugin"

    @property
    def device_type(self) -> str:
        """The device type this strategy trains on (``self.root_device.type``)."""
        return self.root_device.type

    def _check_accelerator(self) -> None:
        """Refuse an accelerator of another device type than the strategy's devices."""
        accelerator_type = getattr(self.accelerator, "device_type", None)
        if accelerator_type is not None and accelerator_type != self.device_type:
            raise ValueError(
                f"{type(self).__name__} runs on {self.root_device}, but the accelerator is {self.accelerator!r}."
                " Leave the strategy's devices unset: it takes them from the accelerator."
            )

    def _align_precision(self) -> None:
        """Rebuild a mixed-precision plugin made for another device type (Lightning picks ``cuda``)."""
        plugin = getattr(self, self._precision_attr)
        setattr(self, self._precision_attr, align_precision_plugin(plugin, self.device_type))

    def _validate_device_setup(self) -> None:
        """Everything that can be checked in the launching process, before any worker starts."""
        self._check_accelerator()
        self._align_precision()

    def _load_portable(self, load: Callable[..., Any], path: Any, **kwargs: Any) -> Any:
        """Load a checkpoint with tensors of missing devices remapped to CPU."""
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        runtime.empty_cache(self.device_type)
        io = getattr(self, "checkpoint_io", None)
        if isinstance(io, TorchCheckpointIO):
            return io.load_checkpoint(path, map_location=portable_map_location, **kwargs)
        return load(path, **kwargs)


class AnyDistributedMixin(AnyStrategyMixin):
    """DDP-family overrides: backend, process-group lifetime, DDP wrapping, barrier, fork check."""

    _process_group_backend: str | None
    _ddp_kwargs: dict[str, Any]
    _start_method: str

    def _resolve_backend(self) -> str:
        return resolve_backend(self.root_device, self._process_group_backend)

    def _validate_device_setup(self) -> None:
        super()._validate_device_setup()
        if self._start_method in ("fork", "forkserver"):
            check_fork_safe(self.device_type)
        self._resolve_backend()

    def _destroy_at_exit(self) -> None:
        """Destroy the process group at exit for every backend (Lightning does it for NCCL only)."""
        atexit.register(_destroy_dist_connection)

    def _wrap_ddp(self, module: torch.nn.Module, device_ids: list[int] | None, default: Callable[[], Any]) -> Any:
        """Wrap ``module`` in DDP; only devices whose table row says so use Lightning's side stream."""
        if get_spec(self.device_type).ddp_side_stream:
            return default()
        return DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)

    def _barrier(self) -> None:
        """A barrier on the device the process group was bound to (no NCCL-only ``device_ids``)."""
        if _distributed_is_initialized():
            torch.distributed.barrier()


class ShardingNotSupportedError(ValueError):
    """The sharded strategy cannot run with this device or these options."""


class AnyShardedMixin(AnyDistributedMixin):
    """Overrides shared by the sharded strategies (FSDP, FSDP2/model-parallel, DeepSpeed).

    Sharding splits parameters, gradients and optimizer state across processes, so it needs a
    collective backend on the device; the process group is bound to the device when it has an
    index, and every device mesh is built on the strategy's device type (Lightning builds FSDP
    meshes on ``"cuda"``, audit row 25).
    """

    #: How the strategy is called in messages.
    _sharding_name: str = "Sharded training"
    _start_method: str = "popen"

    @property
    def _spec(self) -> DeviceSpec:
        return get_spec(self.device_type)

    def _check_sharding(self) -> None:
        """Refuse devices without collectives (e.g. ``mps``) before any process starts."""
        if self._spec.backend is None:
            raise ShardingNotSupportedError(
                f"{self._sharding_name} splits the model across processes, but {self._spec.name}"
                f" ({self.device_type!r}) has no collective backend and runs one device per machine."
                " Use strategy='any_single' there, or a device type with several devices."
            )

    def _validate_device_setup(self) -> None:
        self._check_sharding()
        super()._validate_device_setup()

    def _process_group_device(self) -> torch.device | None:
        """The device to bind the process group to: the root device when it has an index (not on CPU)."""
        return self.root_device if self.root_device.index is not None else None

    def _init_device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
        """A ``DeviceMesh`` of ``shape`` on the strategy's device type."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device_type, tuple(shape), mesh_dim_names=names)


class SafeLaunchMixin:
    """Mixed in before Lightning's multiprocessing launcher (Trainer's or Fabric's).

    Two fixes over Lightning's launcher, which only knows its own CPU/CUDA accelerators:

    - refuse a ``fork`` when the strategy's device type was already initialised in the parent
      (Lightning only checks CUDA), right before the processes start;
    - under ``spawn`` on CPU, give every process its own copy of the model: torch moves tensors
      passed through ``spawn`` into shared memory, so without this all ranks would step the same
      weights (Lightning does it only for ``CPUAccelerator``, not for other accelerators on CPU).
    """

    _start_method: str
    _strategy: Any

    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        if self._start_method in ("fork", "forkserver"):
            check_fork_safe(self._strategy.root_device.type)
        return super().launch(function, *args, **kwargs)  # type: ignore[misc]

    def _wrapping_function(self, process_idx: int, *rest: Any) -> Any:
        if self._start_method == "spawn" and self._strategy.root_device.type == "cpu":
            rest = _disable_module_memory_sharing(rest)
        return super()._wrapping_function(process_idx, *rest)  # type: ignore[misc]
