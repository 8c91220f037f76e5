"""Mixed precision on the accelerator's own device type.

Lightning builds ``MixedPrecision(device="cuda")`` for every accelerator that is not CPU or
MPS: on XPU/HPU/NPU autocast then targets CUDA, switches itself off with a warning and the
model trains in fp32. The functions here build (or repair) the precision plugin for the
right device type and refuse precisions the device cannot do.

Example:
    >>> plugin = mixed_precision_plugin("bf16-mixed", "cpu")
    >>> plugin.device, plugin.precision
    ('cpu', 'bf16-mixed')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.device.spec import PRECISION_DTYPES, DeviceSpec
from lightning_anyaccel.troubleshooting import LinkedError


class PrecisionNotSupportedError(LinkedError, ValueError):
    """The requested precision cannot run on the chosen device."""


def check_precision(precision: str, device_type: str) -> None:
    """Fail fast when ``precision`` cannot autocast on ``device_type``.

    Raises:
        PrecisionNotSupportedError: naming the precisions the device can do.

    >>> check_precision("bf16-mixed", "cpu")
    >>> check_precision("16-mixed", "cpu")
    """
    if precision in PRECISION_DTYPES:
        check_spec_precision(precision, get_spec(device_type))


def check_spec_precision(precision: str, spec: DeviceSpec) -> None:
    """:func:`check_precision` on a device type whose spec the caller holds."""
    dtype = PRECISION_DTYPES.get(precision)
    if dtype is None:
        return
    device_type = spec.type
    if not spec.supports_precision(precision) or not torch.amp.is_autocast_available(device_type):
        choices = [flag for flag, name in PRECISION_DTYPES.items() if name in spec.autocast_dtypes]
        choices.append("32-true")
        raise PrecisionNotSupportedError(
            f"precision={precision!r} needs {dtype} autocast, which {spec.name} ({device_type!r}) does not"
            f" support in this PyTorch. Choose one of: {', '.join(repr(c) for c in choices)}."
        )


def mixed_precision_plugin(precision: str, device_type: str, factory: Callable[..., Any] | None = None) -> Any:
    """A Lightning ``MixedPrecision`` plugin that autocasts on ``device_type``.

    ``factory`` is the plugin class to build (Trainer's by default; Fabric passes its own).
    A ``16-mixed`` plugin gets a ``torch.amp.GradScaler`` for the same device type.
    """
    check_precision(precision, device_type)
    if factory is None:
        from lightning.pytorch.plugins.precision import MixedPrecision

        return MixedPrecision(precision=precision, device=device_type)  # type: ignore[arg-type]
    return factory(precision=precision, device=device_type)


def align_precision_plugin(plugin: Any, device_type: str) -> Any:
    """Return ``plugin``, rebuilt for ``device_type`` when it is a mixed-precision plugin for another one.

    Non-mixed plugins are returned unchanged. A mixed plugin that already targets
    ``device_type`` is checked and kept (a user's custom scaler survives).

    >>> from lightning.pytorch.plugins.precision import MixedPrecision
    >>> align_precision_plugin(MixedPrecision("bf16-mixed", "cuda"), "cpu").device
    'cpu'
    """
    precision = getattr(plugin, "precision", None)
    if precision not in PRECISION_DTYPES or not hasattr(plugin, "device"):
        return plugin
    if plugin.device == device_type:
        check_precision(precision, device_type)
        return plugin
    return mixed_precision_plugin(precision, device_type, factory=type(plugin))


def check_device_supports(precision: str, spec: DeviceSpec, device: torch.device) -> None:
    """Ask ``device`` (of ``spec``'s type) itself whether it can do ``precision`` (e.g. bf16 on pre-Ampere CUDA GPUs).

    This may initialise the device, so it runs in the training process (from
    ``AnyAccelerator.setup_device``), never in a parent that still has to fork.
    """
    if PRECISION_DTYPES.get(precision) != "bf16" or spec.host:
        return
    from lightning_anyaccel.device.runtime import device_module

    probe = getattr(device_module(spec), "is_bf16_supported", None)
    if callable(probe) and not probe():
        raise PrecisionNotSupportedError(
            f"precision={precision!r}: the {spec.name} at {device} does not support bfloat16."
            " Use precision='16-mixed' or '32-true'."
        )
