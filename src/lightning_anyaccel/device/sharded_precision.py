"""FSDP mixed precision on the accelerator's own device type.

Lightning's ``FSDPPrecision`` autocasts on ``"cuda"`` and builds ``ShardedGradScaler()``, whose
device defaults to ``"cuda"``: on any other device autocast switches itself off
and fp16 scaling fails. :class:`AnyFSDPPrecision` takes the device type like Lightning's
``MixedPrecision(precision, device)`` does, so :func:`~lightning_anyaccel.device.precision.align_precision_plugin`
can rebuild it for the strategy's device. Fabric's ``FSDPPrecision`` has the same two faults;
:class:`AnyFabricFSDPPrecision` is the same fix (:class:`DeviceFSDPPrecisionMixin`) for it.

Example:
    >>> plugin = AnyFSDPPrecision("16-mixed", device="cpu")
    >>> plugin.device, plugin.scaler._device
    ('cpu', 'cpu')
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision as FabricFSDPPrecision
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.plugins.precision import FSDPPrecision
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel._lightning.stubs import FSDPPrecisionHooks
from lightning_anyaccel.device.precision import check_precision
from lightning_anyaccel.device.runtime import detect_device_type
from lightning_anyaccel.device.spec import PRECISION_DTYPES

if TYPE_CHECKING:
    _Base = FSDPPrecisionHooks
else:
    _Base = object

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sharded_grad_scaler(precision: str, device_type: str) -> Any:
    """A ``ShardedGradScaler`` on ``device_type`` for ``16-mixed``; ``None`` for every other precision."""
    if precision != "16-mixed":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device=device_type)


def device_autocast(precision: str, device_type: str) -> AbstractContextManager | None:
    """``torch.autocast`` on ``device_type`` for a mixed ``precision``; ``None`` when it is not mixed."""
    dtype = PRECISION_DTYPES.get(precision)
    if dtype is None:
        return None
    return torch.autocast(device_type, dtype=_DTYPES[dtype])


class DeviceFSDPPrecisionMixin(_Base):
    """Autocast and the sharded grad scaler on ``device``; mixed in before either front end's ``FSDPPrecision``.

    Args:
        precision: as for ``FSDPPrecision`` (``"bf16-mixed"``, ``"16-mixed"``, ``"32-true"``, ...).
        scaler: a ``ShardedGradScaler`` of your own (``16-mixed`` only); default: one on ``device``.
        device: the device type to autocast on; ``None`` (default) is the device type the package
            detects (:func:`lightning_anyaccel.device.runtime.detect_device_type`, ``"cpu"`` without an
            accelerator). The strategies set it from their device, so users rarely pass it.

    Raises:
        PrecisionNotSupportedError: ``device`` cannot autocast in ``precision``.
    """

    precision: Any

    def __init__(self, precision: Any, scaler: Any = None, device: str | None = None) -> None:
        if device is None:
            device = detect_device_type()
        check_precision(precision, device)
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"precision={precision!r} does not use a scaler, found {scaler}.")
        # Lightning's __init__ refuses any scaler (it checks before setting `precision`) and builds
        # a CUDA one for 16-mixed, so the device's scaler is set afterwards.
        super().__init__(precision)
        self.scaler = scaler if scaler is not None else sharded_grad_scaler(precision, device)
        self.device = device

    @override
    def forward_context(self) -> AbstractContextManager:
        """Autocast on the plugin's device type (Lightning's targets ``"cuda"``)."""
        return device_autocast(self.precision, self.device) or super().forward_context()


class AnyFSDPPrecision(DeviceFSDPPrecisionMixin, FSDPPrecision):
    """The Trainer's ``FSDPPrecision`` with autocast and the sharded grad scaler on ``device``.

    Also clips gradients by norm (``Trainer(gradient_clip_val=...)``), which Lightning's plugin
    refuses because it has no reference to the root FSDP module: the strategy sets
    :attr:`fsdp_module` once it has wrapped the model, and the norm is computed by
    ``FullyShardedDataParallel.clip_grad_norm_`` over all shards (``torch.nn.utils.clip_grad_norm_``
    would only see this rank's shard).

    Arguments: see :class:`DeviceFSDPPrecisionMixin`.
    """

    #: The root ``FullyShardedDataParallel`` module; set by :class:`~lightning_anyaccel.strategies.fsdp.AnyFSDPStrategy`.
    fsdp_module: Module | None = None

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: int | float) -> None:
        """Clip the gradients of every shard to a total norm of ``clip_val`` (FSDP's ``clip_grad_norm_``).

        Raises:
            MisconfigurationException: the model's root module is not wrapped in FSDP (only submodules
                were wrapped in ``configure_model``), so no total norm over all parameters exists.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not isinstance(self.fsdp_module, FullyShardedDataParallel):
            raise MisconfigurationException(
                "gradient_clip_algorithm='norm' under FSDP needs the root module wrapped in FullyShardedDataParallel,"
                " but only submodules were wrapped (in configure_model). Let the strategy wrap the model"
                " (AnyFSDPStrategy(auto_wrap_policy={YourBlock})), or clip by value (gradient_clip_algorithm='value')."
            )
        self.fsdp_module.clip_grad_norm_(clip_val)


class AnyFabricFSDPPrecision(DeviceFSDPPrecisionMixin, FabricFSDPPrecision):
    """Fabric's ``FSDPPrecision`` with autocast and the sharded grad scaler on ``device``.

    Arguments: see :class:`DeviceFSDPPrecisionMixin`.

    Example:
        >>> plugin = AnyFabricFSDPPrecision("bf16-mixed", device="cpu")
        >>> plugin.device, plugin.scaler
        ('cpu', None)
    """


__all__ = ["AnyFSDPPrecision", "AnyFabricFSDPPrecision", "DeviceFSDPPrecisionMixin", "device_autocast",
           "sharded_grad_scaler"]
