"""What the sharded strategies (FSDP, FSDP2, DeepSpeed) share, for the Trainer and for Fabric: :class:`AnyShardedMixin`.

Sharding splits parameters, gradients and optimizer state across processes. Lightning's FSDP,
ModelParallel and DeepSpeed strategies assume CUDA in their precision plugins, device meshes,
device ids and accelerator checks; each family module
(:mod:`~lightning_anyaccel.strategies.fsdp`, ``.model_parallel``, ``.deepspeed``) replaces those
parts from the device table, on this common base.

Example:
    >>> from lightning_anyaccel.strategies import AnyFSDPStrategy
    >>> AnyFSDPStrategy(parallel_devices=[torch.device("cpu")] * 2)._process_group_device() is None
    True
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from lightning_anyaccel.device.devices import DeviceSpec, get_spec
from lightning_anyaccel.strategies.multi_process import AnyDistributedMixin


class AnyShardedMixin(AnyDistributedMixin):
    """Overrides shared by the sharded strategies (FSDP, FSDP2/model-parallel, DeepSpeed).

    Sharding needs a collective backend on the device (the step
    :func:`~lightning_anyaccel.strategies.steps.check_collectives`); the process group is bound to
    the device when it has an index, and every device mesh is built on the strategy's device type
    (Lightning builds FSDP meshes on ``"cuda"``).
    """

    #: How the strategy is called in messages.
    sharding_name: str = "Sharded training"
    #: How the processes start (Lightning's DDP attribute and type; the sharded strategies start them with ``popen``).
    _start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen"

    @property
    def spec(self) -> DeviceSpec:
        """The device type's entry of the device table."""
        return get_spec(self.device_type)

    def _process_group_device(self) -> torch.device | None:
        """The device to bind the process group to: the root device when it has an index (not on CPU)."""
        return self.root_device if self.root_device.index is not None else None

    def init_device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
        """A ``DeviceMesh`` of ``shape`` on the strategy's device type."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device_type, tuple(shape), mesh_dim_names=names)


__all__ = ["AnyShardedMixin"]
