"""Lightning Fabric on every accelerator PyTorch knows.

The accelerator is the Trainer's :class:`~lightning_anyaccel.AnyAccelerator` (Lightning's Trainer
accelerators are Fabric accelerators too); the strategies are Fabric's, with the same shared
device logic as the Trainer ones. Importing this module (or ``lightning_anyaccel``) registers in
Fabric's registries the same names as for the Trainer: ``accelerator="any"``, ``"xpu"``,
``"hpu"``, ``"npu"``, ... and ``strategy="any_single"``, ``"any_ddp"``, ``"any_ddp_spawn"``,
``"any_ddp_fork"``, ``"any_ddp_notebook"``; sharded: ``"any_fsdp"``, ``"any_fsdp_cpu_offload"``,
``"any_fsdp2"``, ``"any_model_parallel"`` and ``"any_deepspeed"``, ``"any_deepspeed_stage_1"`` ...
``"any_deepspeed_stage_3_offload"``.

Example:
    >>> from lightning import Fabric
    >>> from lightning_anyaccel.fabric import AnyAccelerator, AnyDDPStrategy
    >>> fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=AnyDDPStrategy(), devices=2)
    >>> type(fabric.strategy).__module__, fabric.strategy.num_processes
    ('lightning_anyaccel.fabric.strategies', 2)
"""

from __future__ import annotations

from lightning.fabric.utilities.seed import seed_everything as _lightning_seed_everything

from lightning_anyaccel.accelerator import AnyAccelerator  # noqa: F401  (public: __all__ below)
from lightning_anyaccel.checkpoints.checkpoint import portable_map_location  # noqa: F401  (public: __all__ below)
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.device.sharded_precision import AnyFabricFSDPPrecision  # noqa: F401  (public: __all__ below)
from lightning_anyaccel.fabric import strategies as _strategies

globals().update({name: getattr(_strategies, name) for name in _strategies.__all__})


def register() -> None:
    """Register the package's accelerator and strategy names in Fabric's registries (done at import)."""
    from lightning_anyaccel import _lightning
    from lightning_anyaccel.wiring import registration

    registration.register_fabric(_lightning.LIGHTNING)


def seed_everything(seed: int | None = None, workers: bool = True, device_type: str | None = None) -> int:
    """``Fabric.seed_everything`` plus the device's own generators (``torch.manual_seed`` skips HPU's).

    ``AnyAccelerator`` seeds the device when a process starts if a seed was set before
    ``fabric.launch()``; call this instead of ``fabric.seed_everything`` to seed *after* launch
    on every device type. ``device_type`` defaults to what ``torch.accelerator`` reports.

    >>> seed_everything(7, device_type="cpu")
    7
    """
    value = _lightning_seed_everything(seed, workers=workers, verbose=False)
    spec = get_spec(device_type or runtime.detect_device_type())
    if runtime.is_available(spec):
        runtime.seed(spec, value)
    return value


register()

__all__ = sorted([
    *_strategies.__all__,
    "AnyAccelerator",
    "AnyFabricFSDPPrecision",
    "portable_map_location",
    "register",
    "seed_everything",
])
