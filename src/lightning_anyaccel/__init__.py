"""lightning-anyaccel: train with PyTorch Lightning on every accelerator PyTorch knows.

Importing the package registers, for the Trainer:

- accelerators ``"any"`` (the device ``torch.accelerator`` reports, else CPU) and one name per
  device type Lightning has no accelerator for (``"xpu"``, ``"hpu"``, ``"npu"``, ``"sdaa"``,
  ``"mlu"``, ``"musa"``); ``"cpu"``, ``"cuda"`` and ``"mps"`` stay Lightning's;
- strategies ``"any_single"``, ``"any_ddp"``, ``"any_ddp_spawn"``, ``"any_ddp_fork"`` and
  ``"any_ddp_notebook"``; sharded: ``"any_fsdp"``, ``"any_fsdp_cpu_offload"``, ``"any_fsdp2"``
  (``"any_model_parallel"``) and ``"any_deepspeed"``, ``"any_deepspeed_stage_{1,2,3}"`` (``_offload``);

and the same names in Lightning Fabric's registries (see :mod:`lightning_anyaccel.fabric`), for
``lightning`` and for ``pytorch_lightning``/``lightning_fabric`` (:mod:`lightning_anyaccel.wiring.registration`).
With the package's accelerator, ``strategy="auto"`` and Lightning's strategy names select the
package's strategies (:mod:`lightning_anyaccel.wiring.policy`): ``Trainer(accelerator="xpu", devices=8)``
trains with ``any_ddp`` on 8 XPUs.

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_single", devices=1, logger=False)
"""

from lightning_anyaccel._compat import check_torch

check_torch()

from lightning_anyaccel._version import __version__  # noqa: E402
from lightning_anyaccel.accelerator import (  # noqa: E402
    AnyAccelerator,
    DeviceCountError,
    DeviceTypeError,
    accelerator_class,
)
from lightning_anyaccel.checkpoints.checkpoint import portable_map_location  # noqa: E402
from lightning_anyaccel.device.compilation import CompileNotSupportedError, compile  # noqa: E402
from lightning_anyaccel.device.devices import DEVICE_TABLE, DeviceSpec, get_spec, register_device  # noqa: E402
from lightning_anyaccel.device.distributed import BackendError, ForkAfterInitError, resolve_backend  # noqa: E402
from lightning_anyaccel.device.precision import PrecisionNotSupportedError  # noqa: E402
from lightning_anyaccel.device.profiling import profiler_activities, profiler_sort_key  # noqa: E402
from lightning_anyaccel.device.runtime import DeviceNotAvailableError, detect_device_type  # noqa: E402
from lightning_anyaccel.device.sharded_precision import AnyFSDPPrecision  # noqa: E402
from lightning_anyaccel.strategies import DeepSpeedNotInstalledError, ShardingNotSupportedError  # noqa: E402
from lightning_anyaccel.strategies.families import trainer_strategies  # noqa: E402
from lightning_anyaccel.wiring.errors import FrontEndMismatchError, StrategyNotSupportedError  # noqa: E402

globals().update(trainer_strategies())  # AnyDDPStrategy, ...: one per row of strategies.families.FAMILIES


def register() -> None:
    """Register the package's names with every Lightning package (done at import; see :mod:`.registration`)."""
    from lightning_anyaccel.wiring import registration

    registration.register()


register()

__all__ = [
    *trainer_strategies(),
    "DEVICE_TABLE",
    "AnyAccelerator",
    "AnyFSDPPrecision",
    "BackendError",
    "CompileNotSupportedError",
    "DeepSpeedNotInstalledError",
    "DeviceCountError",
    "DeviceNotAvailableError",
    "DeviceTypeError",
    "DeviceSpec",
    "ForkAfterInitError",
    "FrontEndMismatchError",
    "PrecisionNotSupportedError",
    "ShardingNotSupportedError",
    "StrategyNotSupportedError",
    "__version__",
    "accelerator_class",
    "compile",
    "detect_device_type",
    "get_spec",
    "portable_map_location",
    "profiler_activities",
    "profiler_sort_key",
    "register",
    "register_device",
    "resolve_backend",
]
